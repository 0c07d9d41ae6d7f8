"""Locks: exactly which inputs a build read, and which bytes it wrote.

A lock is one JSON document, the same beside a recipe (`RECIPE.lock`, committed with it) and in
every output folder (`ptc.lock`):

    format, version
    inputs      what decides the output's bytes: the recipe's bytes, the target's fingerprints,
                each term's grid, descriptors and their sources' fingerprints, the settings,
                and the versions of ptc and the libraries that write the files
    lock_hash   sha256 of the canonical JSON of `inputs`: the name of a build
    edit        what the build derived (operator hashes, an adapter's hash); absent before a build
    outputs     sha256 of every file of the output folder; absent before a build
    seal        sha256 of everything above, so that a changed byte anywhere shows

`ptc build --locked` compares `inputs` only; `ptc verify` compares `outputs`; `ptc diff`
compares everything.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, cast

from ptc import __version__
from ptc.errors import InputError, OutputError, PtcError
from ptc.files import file_sha256, write_json_atomic
from ptc.output_dirs import OUTPUT_MARKER, STAGING_MARKER

if TYPE_CHECKING:  # `ptc verify` and `ptc diff` load no model and need no torch
    from ptc.compiler.recipe.plan import Plan, PlannedTerm
    from ptc.targets.base import DualEncoder

LOCK_FORMAT = 2
LOCK_NAME = "ptc.lock"
# this run's timings and cache counts: the one file that differs between builds
RUN_RECORD = "run.json"
NOT_OUTPUTS = (LOCK_NAME, RUN_RECORD, OUTPUT_MARKER, STAGING_MARKER)
# The distributions whose code writes an output's bytes (exporters, savers, tokenizers).
LIBRARIES = (
    "torch",
    "transformers",
    "open_clip_torch",
    "peft",
    "safetensors",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "onnxruntime-gpu",
    "onnxconverter-common",
    "tokenizers",
    "numpy",
)


class LockDrift(PtcError):
    """`--locked` found inputs that differ from the lock: one line per input."""


def _canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def sha256_of(value: Any) -> str:
    return hashlib.sha256(_canonical(value)).hexdigest()


def library_versions() -> dict[str, str]:
    versions = {"ptc": __version__}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def term_inputs(planned_term: PlannedTerm) -> dict[str, Any]:
    """One term as its inputs: the task's grid, each source descriptor with what it was made from."""
    term = planned_term.term
    sources = [
        {
            "id": entry.meta.get("id"),
            "sha256": entry.sha256,
            "source_input_fingerprint": entry.meta.get("source_input_fingerprint"),
            "finetuned_input_fingerprint": entry.meta.get("finetuned_input_fingerprint"),
            "text_fingerprint": entry.meta.get("text_fingerprint"),
        }
        for entry in planned_term.sources
    ]
    return {
        "task": term.task,
        "source": term.label,
        "weight": term.weight,
        "kind": term.kind,
        "combine": term.combine if len(term.sources) > 1 else None,
        "grid_hash": planned_term.task.grid_hash,
        "descriptors": sources,
    }


def lock_inputs(plan: Plan, target: DualEncoder) -> dict[str, Any]:
    """Everything that decides a build's bytes, read without building (the target is loaded to
    fingerprint its weights; nothing is embedded or solved)."""
    recipe = plan.recipe
    settings = {
        "route": recipe.route,
        **recipe.model_dump(include={"solve", "strength", "adapter", "verify"}),
        "export": recipe.export.model_dump(exclude={"out"}),
    }
    return {
        "recipe_sha256": hashlib.sha256(plan.recipe_bytes).hexdigest(),
        "target": {
            "ref": recipe.target,
            "input_fingerprint": target.input_fingerprint(),
            "text_fingerprint": target.text_fingerprint(),
        },
        "terms": [term_inputs(pt) for pt in plan.terms],
        "settings": json.loads(json.dumps(settings, default=list)),
        "versions": library_versions(),
    }


class LockDocument(TypedDict, total=False):
    """A lock: what a build read (`inputs`), derived (`edit`) and wrote (`outputs`), sealed."""

    format: str
    version: int
    inputs: dict[str, Any]
    lock_hash: str
    edit: dict[str, Any]
    outputs: dict[str, str]  # output file -> sha256
    seal: str


class Difference(TypedDict):
    """One leaf that differs between two locks: its dotted path, and each side (None: absent)."""

    path: str
    a: Any
    b: Any


def lock_document(
    inputs: dict[str, Any],
    edit: dict[str, Any] | None = None,
    outputs: dict[str, str] | None = None,
) -> LockDocument:
    document: LockDocument = {
        "format": "ptc-lock",
        "version": LOCK_FORMAT,
        "inputs": inputs,
        "lock_hash": sha256_of(inputs),
    }
    if edit is not None:
        document["edit"] = edit
    if outputs is not None:
        document["outputs"] = outputs
    return {**document, "seal": sha256_of(document)}


def read_lock(path: Path) -> LockDocument:
    """A lock, checked whole: format, seal and lock hash; anything else is one clear error."""
    path = Path(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{path}: no such lock", "write one with `ptc lock RECIPE` or `ptc build RECIPE`"
        ) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise OutputError(
            f"{path}: cannot read the lock: {exc}".split("\n")[0], "rebuild it"
        ) from None
    if not isinstance(document, dict) or document.get("format") != "ptc-lock":
        raise OutputError(
            f"{path}: not a ptc lock (no format: ptc-lock)", "write one with `ptc lock RECIPE`"
        )
    if document.get("version") != LOCK_FORMAT:
        raise OutputError(
            f"{path}: lock format {document.get('version')!r}; this ptc reads {LOCK_FORMAT}",
            "write it again with `ptc lock RECIPE`",
        )
    body = {k: v for k, v in document.items() if k != "seal"}
    if document.get("seal") != sha256_of(body) or document.get("lock_hash") != sha256_of(
        document.get("inputs")
    ):
        raise OutputError(
            f"{path}: the lock was modified (its seal does not match its content)",
            "write it again with `ptc lock RECIPE`, or restore it from version control",
        )
    return cast(LockDocument, document)


def named_base_exports(path: Path) -> set[str]:
    """The bank export keys a lock's build copied its towers from (`edit.base_exports`). Read
    leniently: a lock that is gone or unreadable names nothing; one modified by hand still
    names what it names (keeping an export is the safe side)."""
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
        named = document["edit"]["base_exports"]
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return set()
    return (
        {key for key in named.values() if isinstance(key, str)}
        if isinstance(named, dict)
        else set()
    )


def recipe_lock_path(recipe_path: Path) -> Path:
    """`recipes/demo.yaml` -> `recipes/demo.lock`."""
    return Path(recipe_path).with_suffix(".lock")


def refuse_foreign_lock(path: Path) -> None:
    """A file at a recipe's lock path that is not a ptc lock is the user's: never overwritten."""
    if not path.exists():
        return
    try:
        foreign = json.loads(path.read_text(encoding="utf-8")).get("format") != "ptc-lock"
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        foreign = True
    if foreign:
        raise OutputError(
            f"{path} exists and is not a ptc lock; ptc will not overwrite it",
            "move it away, or rename the recipe",
        )


def previous_lock(path: Path) -> LockDocument | None:
    """The recipe's current lock, if it has a readable one (a damaged ptc lock is replaced)."""
    refuse_foreign_lock(path)
    try:
        return read_lock(path) if path.exists() else None
    except OutputError:
        return None


def write_recipe_lock(path: Path, document: LockDocument) -> None:
    refuse_foreign_lock(path)
    write_json_atomic(path, document)


# -- comparing ------------------------------------------------------------------------------------
def _flat(value: Any, path: str, out: dict[str, Any]) -> dict[str, Any]:
    """Leaves by readable path; terms are keyed by task/source, not by position, so that a
    reordered recipe reads as what it is and a changed weight names its term."""
    if isinstance(value, dict):
        for key in sorted(value):
            _flat(value[key], f"{path}.{key}" if path else key, out)
    elif (
        isinstance(value, list)
        and path.endswith("terms")
        and all(isinstance(t, dict) for t in value)
    ):
        for term in value:
            _flat(
                {k: v for k, v in term.items() if k not in ("task", "source")},
                f"{path}[{term.get('task')}/{term.get('source')}]",
                out,
            )
    elif isinstance(value, list) and all(isinstance(t, dict) and "id" in t for t in value):
        for item in value:
            _flat({k: v for k, v in item.items() if k != "id"}, f"{path}[{item['id']}]", out)
    else:
        out[path] = value
    return out


def differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[Difference]:
    """Every leaf that differs between two documents: {path, a, b} (None where absent)."""
    left, right = _flat(a, "", {}), _flat(b, "", {})
    return [
        {"path": path, "a": left.get(path), "b": right.get(path)}
        for path in sorted(set(left) | set(right))
        if left.get(path) != right.get(path)
    ]


def describe(difference: Difference) -> str:
    a, b = difference["a"], difference["b"]
    if a is None:
        return f"{difference['path']}: added ({_short(b)})"
    if b is None:
        return f"{difference['path']}: removed (was {_short(a)})"
    return f"{difference['path']}: {_short(a)} -> {_short(b)}"


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    # hashes: a prefix says enough
    return text[:16] if isinstance(value, str) and len(value) == 64 else text


def check_locked(lock_path: Path, inputs: dict[str, Any]) -> None:
    """LockDrift, one line per drifted input, naming it and both values, unless `inputs` are
    exactly the lock's."""
    locked = read_lock(lock_path)["inputs"]
    drifted = differences({"inputs": locked}, {"inputs": inputs})
    if drifted:
        lines = "\n".join(
            f"  {d['path']}: locked {_short(d['a'])}, now {_short(d['b'])}" for d in drifted
        )
        raise LockDrift(
            f"{lock_path}: {len(drifted)} input(s) differ from the lock (--locked)\n{lines}", None
        )


# -- verifying an output --------------------------------------------------------------------------
def output_files(root: Path) -> list[Path]:
    return [p for p in sorted(Path(root).rglob("*")) if p.is_file() and p.name not in NOT_OUTPUTS]


def verify_output(out: Path, lock_path: Path | None = None) -> tuple[int, list[str]]:
    """(files checked, problems): every file the lock lists has its bytes, nothing else is
    there, and the report's verification figures are within the tolerances it recorded."""
    out = Path(out)
    if not out.is_dir():
        raise InputError(f"{out}: not a folder", "give a build's output folder")
    lock = read_lock(lock_path or out / LOCK_NAME)
    recorded = lock.get("outputs")
    if not isinstance(recorded, dict) or not recorded:
        raise OutputError(
            f"{lock_path or out / LOCK_NAME}: the lock records no outputs",
            "lock a built output, or build the recipe once without --locked",
        )
    present = {p.relative_to(out).as_posix(): p for p in output_files(out)}
    problems = [f"{name}: missing" for name in sorted(set(recorded) - set(present))]
    problems += [f"{name}: not in the lock" for name in sorted(set(present) - set(recorded))]
    actual = {name: file_sha256(present[name]) for name in sorted(set(recorded) & set(present))}
    problems += [
        f"{name}: sha256 {actual[name][:16]} != locked {recorded[name][:16]}"
        for name in actual
        if actual[name] != recorded[name]
    ]
    return len(recorded), problems + _report_problems(out, lock)


def _report_problems(out: Path, lock: LockDocument) -> list[str]:
    """The report's figures against its own tolerances, and its lock hash against the lock's."""
    from ptc.files import read_json_file

    report = read_json_file(out / "report.json", "build report")
    if not isinstance(report, dict):
        return ["report.json: not a build report"]
    problems = (
        []
        if report.get("lock_hash") == lock["lock_hash"]
        else ["report.json: lock_hash differs from the lock's"]
    )
    verify = report.get("verify") or {}
    tolerances, equivalence = verify.get("tolerances") or {}, verify.get("equivalence") or {}
    linearity = verify.get("linearity") or {}
    checks = [
        (
            "linearity fp64",
            linearity.get("max_rel_diff_fp64"),
            tolerances.get("linearity_rtol_fp64"),
        ),
        ("linearity fp32", linearity.get("max_rel_diff_fp32"), tolerances.get("linearity_rtol")),
        *[
            (name, equivalence.get(name), tolerances.get("equivalence_atol"))
            for name in ("torch_max_abs_diff", "onnx_max_abs_diff", "reload_max_abs_diff")
        ],
    ]
    for name, figure, limit in checks:
        if figure is not None and limit is not None and not figure <= limit:
            problems.append(f"report.json: {name} {figure:.2e} exceeds its tolerance {limit:.0e}")
    return problems


def load_lock_or_output(path: Path) -> LockDocument:
    """`ptc diff` takes a lock file or an output folder (its ptc.lock)."""
    path = Path(path)
    return read_lock(path / LOCK_NAME if path.is_dir() else path)
