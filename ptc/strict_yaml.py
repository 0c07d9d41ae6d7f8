"""Strict YAML: safe loading, duplicate keys rejected, and line numbers for every field.

Recipe and task files are validated by pydantic models; this module turns the first
validation error into one line that names the file, the line, the field and what was
expected, with a "did you mean" for misspelled keys.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import pydantic
import yaml
from pydantic_core import ErrorDetails

from ptc.errors import InputError

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)

FieldPath = tuple[str | int, ...]
# recipes, task files and plans are hand-written: 4 MiB is far past any real one
MAX_FILE_BYTES = 4 << 20


def _path_text(value: str) -> str:
    """A path or model reference written in a YAML file: not blank, no control characters
    (a NUL or a newline in a path is a mistake or an attack, never a file name)."""
    if not value.strip():
        raise ValueError("expected a non-empty path")
    bad = next((c for c in value if ord(c) < 0x20 or ord(c) == 0x7F), None)
    if bad is not None:
        raise ValueError(f"expected a path without control characters (found {bad!r})")
    return value


PathText = Annotated[str, pydantic.AfterValidator(_path_text)]


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(
    loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False
) -> dict[Any, Any]:
    seen: dict[Any, yaml.Node] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        seen[key] = key_node
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _line_of(root: yaml.Node | None, path: FieldPath) -> int | None:
    """1-based line of the deepest node along `path` that exists in the composed tree."""
    node, line = root, (root.start_mark.line + 1 if root is not None else None)
    for part in path:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == part]
            if not match:
                break
            key_node, node = match[0]
            line = key_node.start_mark.line + 1
        elif (
            isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value)
        ):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def format_path(path: FieldPath) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def load_yaml(path: Path, error: type[InputError]) -> tuple[Any, Callable[[FieldPath], int | None]]:
    """Parse `path` safely; return the data and a function from field path to line number."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise error(
                f"{path}: the file is {size / 2**20:.1f} MiB; ptc reads at most {MAX_FILE_BYTES >> 20} MiB "
                "from a YAML file",
                "is this the right file?",
            )
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"{path}: cannot read: {exc}") from None
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = exc.problem or exc.context or "invalid YAML"
        raise error(f"{where}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise error(f"{path}: YAML error: {exc}") from None
    return data, lambda field_path: _line_of(root, field_path)


def _describe_error(err: ErrorDetails, model: type[pydantic.BaseModel]) -> str:
    kind, loc = err["type"], err["loc"]
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1])
        guess = difflib.get_close_matches(str(loc[-1]), allowed, n=1)
        hint = (
            f" (did you mean {guess[0]!r}?)"
            if guess
            else f" (expected one of: {', '.join(allowed)})"
        )
        return f"unknown key {loc[-1]!r}{hint}"
    if kind == "missing":
        return "required field is missing"
    got = err.get("input")
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    message = err["msg"].removeprefix("Value error, ").rstrip(".")
    if isinstance(got, str) and _looks_numeric(got):
        message += " (YAML reads exponents without a sign as text: write 1.0e+9, not 1.0e9)"
    return f"{message}, got {shown}"


def _looks_numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _allowed_keys(model: type[pydantic.BaseModel], loc: tuple) -> list[str]:
    """Field names of the (sub)model that `loc` points into."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        annotation = field.annotation
        inner = [a for a in getattr(annotation, "__args__", ()) if hasattr(a, "model_fields")]
        current = inner[0] if inner else annotation
    return sorted(getattr(current, "model_fields", {}))


def validate(
    model: type[ModelT],
    data: Any,
    path: Path,
    locate: Callable[[tuple[Any, ...]], int | None],
    error: type[InputError],
) -> ModelT:
    """Validate `data` against `model`; raise `error` with file:line, field and expectation."""
    if not isinstance(data, dict):
        raise error(
            f"{path}: expected a mapping of keys at the top level, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except pydantic.ValidationError as exc:
        # An unknown key usually also makes a required one "missing": report the key first.
        errors = exc.errors()
        err = sorted(errors, key=lambda e: e["type"] != "extra_forbidden")[0]
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        line = locate(loc)
        where = f"{path}:{line}" if line else str(path)
        locs = [
            tuple(p for p in e["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            for e in errors
        ]
        # the other fields, without one that only contains a field already named (pydantic adds
        # a container's own error on top of its member's)
        others = [
            format_path(o)
            for o in dict.fromkeys(locs)
            if o != loc and not any(len(x) > len(o) and x[: len(o)] == o for x in locs)
        ][:5]
        more = f" (and {len(others)} more: {', '.join(others)})" if others else ""
        raise error(f"{where}: {format_path(loc)}: {_describe_error(err, model)}{more}") from None
