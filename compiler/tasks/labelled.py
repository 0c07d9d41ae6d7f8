"""Labelled folders (`DIR/<class name>/*`) for evaluation and fine-tuning."""

from __future__ import annotations

from pathlib import Path

from ptc.compiler.tasks.grid import PROBE_SUFFIXES
from ptc.errors import InputError


def labelled_files(data_dir: Path, classes: tuple[str, ...]) -> list[tuple[Path, int]]:
    """(file, class index) pairs, sorted; every sub-folder must be one of `classes`."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise InputError(f"{data_dir}: not a folder", "expected DIR/<class name>/<files>")
    folders = sorted(p for p in data_dir.iterdir() if p.is_dir())
    unknown = [p.name for p in folders if p.name not in classes]
    if unknown:
        raise InputError(
            f"{data_dir}: folder {unknown[0]!r} is not one of the task's classes",
            f"classes: {', '.join(classes)}",
        )
    pairs = [
        (f, classes.index(folder.name))
        for folder in folders
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.suffix.lower() in PROBE_SUFFIXES
    ]
    if not pairs:
        raise InputError(
            f"{data_dir}: no labelled files found", "expected DIR/<class name>/<files>"
        )
    return pairs
