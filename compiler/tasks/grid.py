"""Task files and task grids.

A task is a YAML file in version control: a name, a set of unlabeled probe files and the
class prompts. Its grid is the sorted probe files x the classes; the grid hash covers the
probe bytes and the prompt strings (not the file names), so renaming a probe keeps the grid
while changing a single pixel or a template makes a new one.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import pydantic

from ptc.errors import PtcError, TaskError
from ptc.strict_yaml import PathText, load_yaml, validate

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
PROBE_SUFFIXES = {
    ".png",
    ".jpg",
    ".jpeg",
    ".bmp",
    ".webp",
    ".gif",
    ".tif",
    ".tiff",
    ".wav",
    ".flac",
    ".ogg",
    ".mp3",
}
AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".mp3"}
DEFAULT_TEMPLATES = ("a photo of a {}.",)


ClassName = Annotated[str, pydantic.StringConstraints(min_length=1)]


class TaskFile(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True)

    name: str = pydantic.Field(pattern=NAME_PATTERN)
    probes: PathText | list[PathText] = pydantic.Field(min_length=1)
    classes: list[ClassName] = pydantic.Field(min_length=2)
    templates: list[str] = pydantic.Field(default=list(DEFAULT_TEMPLATES), min_length=1)

    @pydantic.field_validator("classes")
    @classmethod
    def _distinct(cls, classes: list[str]) -> list[str]:
        duplicates = sorted({c for c in classes if classes.count(c) > 1})
        if duplicates:
            raise ValueError(f"class names must be distinct; repeated: {duplicates}")
        return classes

    @pydantic.field_validator("templates")
    @classmethod
    def _one_slot(cls, templates: list[str]) -> list[str]:
        for template in templates:
            if template.count("{}") != 1:
                raise ValueError(
                    f"each template needs exactly one '{{}}' for the class name: {template!r}"
                )
        return templates


@dataclass(frozen=True)
class TaskSpec:
    """A validated task with its probe files resolved to absolute, sorted paths."""

    name: str
    probes: tuple[Path, ...]
    classes: tuple[str, ...]
    templates: tuple[str, ...]
    source_file: Path | None = None

    @property
    def prompts(self) -> list[str]:
        """Class-major prompt strings: all templates of class 0, then class 1, ..."""
        return [t.replace("{}", c) for c in self.classes for t in self.templates]

    def grid_hash(self) -> str:
        return grid_hash(self.probes, self.prompts)


def probe_files(folder: Path) -> list[Path]:
    """Every probe file under `folder` (recursively), in grid order: sorted by relative path."""
    files = [
        p for p in Path(folder).rglob("*") if p.is_file() and p.suffix.lower() in PROBE_SUFFIXES
    ]
    return sorted(files, key=lambda p: p.relative_to(folder).as_posix())


def _collect_probes(spec: TaskFile, base: Path, task_path: Path) -> tuple[Path, ...]:
    if isinstance(spec.probes, str):
        folder = (base / spec.probes).resolve()
        if not folder.is_dir():
            raise TaskError(
                f"{task_path}: probes: {folder} is not a folder",
                "give a folder of probe files or a list of files, relative to the task file",
            )
        files = probe_files(folder)
    else:
        files = sorted(((base / p).resolve() for p in spec.probes), key=lambda p: p.as_posix())
        missing = [str(p) for p in files if not p.is_file()]
        if missing:
            raise TaskError(
                f"{task_path}: probes: file not found: {missing[0]}"
                + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
            )
    if not files:
        raise TaskError(
            f"{task_path}: probes: no probe files found in {spec.probes}",
            f"supported suffixes: {' '.join(sorted(PROBE_SUFFIXES))}",
        )
    return tuple(files)


def check_probes_decode(task_path: Path, probes: tuple[Path, ...]) -> None:
    """Every probe decodes as what its suffix says (an image, or audio), so that a broken file
    is refused when the task is registered, not at the first forward pass of a later build."""
    from ptc.media import open_image, read_audio

    for probe in probes:
        try:
            if probe.suffix.lower() in AUDIO_SUFFIXES:
                read_audio(probe, 16_000, 16)  # reads and decodes; the window is irrelevant here
            else:
                open_image(probe)
        except PtcError as exc:
            raise TaskError(f"{task_path}: probes: {exc.message}", exc.hint) from None


def load_task(path: Path, decode: bool = True) -> TaskSpec:
    """Read and validate a task file; probe paths are relative to the file's folder. With
    `decode`, every probe is also decoded once (see check_probes_decode)."""
    path = Path(path)
    data, locate = load_yaml(path, TaskError)
    spec = validate(TaskFile, data, path, locate, TaskError)
    probes = _collect_probes(spec, path.resolve().parent, path)
    if decode:
        check_probes_decode(path, probes)
    return TaskSpec(spec.name, probes, tuple(spec.classes), tuple(spec.templates), path.resolve())


def grid_hash(probes: tuple[Path, ...] | list[Path], prompts: list[str]) -> str:
    """sha256 over probe bytes (in grid order) and prompt strings, length-prefixed."""
    digest = hashlib.sha256(b"ptc-grid-v1")
    for probe in probes:
        try:
            data = Path(probe).read_bytes()
        except OSError as exc:
            raise TaskError(
                f"probe {probe}: cannot read: {exc.strerror}",
                "the probes moved or changed since the task was registered",
            ) from None
        digest.update(len(data).to_bytes(8, "little") + data)
    for prompt in prompts:
        encoded = prompt.encode("utf-8")
        digest.update(b"P" + len(encoded).to_bytes(8, "little") + encoded)
    return digest.hexdigest()


def check_name(kind: str, name: str) -> str:
    # fullmatch: `$` in re.match also accepts a trailing newline ("src\n")
    if not isinstance(name, str) or not re.fullmatch(
        NAME_PATTERN.removeprefix("^").removesuffix("$"), name
    ):
        raise TaskError(
            f"{kind} name {name!r} is not valid",
            "use letters, digits, '.', '_' or '-', starting with a letter or digit",
        )
    return name
