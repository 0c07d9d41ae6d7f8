"""Output folders ptc owns: built in a staging folder and renamed into place, marked with
what ptc wrote there, and replaced only while that mark covers everything in them; an
output never lies in the bank or over the recipe."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ptc.files import dead_writer, fsync_dir, share_tree, write_json_atomic


def remove_stale_staging(folder: Path, name: str) -> list[Path]:
    """Staging and swap folders of output `name` left by processes that died (SIGKILL, power
    loss). Only folders that are provably ptc's go: a staging folder carrying ptc's staging
    marker (or still empty), an old output swapped aside that ptc's output marker covers whole.
    A folder of someone else's that merely matches the name pattern is left alone."""
    stale: list[Path] = []
    for candidate in sorted(folder.glob(f".{name}.*.partial")) + sorted(
        folder.glob(f".{name}.*.old")
    ):
        if candidate.is_symlink() or not candidate.is_dir() or not dead_writer(candidate, name):
            continue
        marked = (candidate / STAGING_MARKER).is_file() or not any(candidate.iterdir())
        if (
            candidate.suffix == ".partial"
            and marked
            or candidate.suffix == ".old"
            and not foreign_entries(candidate)
        ):
            shutil.rmtree(candidate, ignore_errors=True)
            stale.append(candidate)
    return stale


# -- ownership of output folders -----------------------------------------------------------------
# Every folder staged_directory writes ends with OUTPUT_MARKER: the size and modification time of
# every file ptc put there (not a hash: a warm rebuild must not read gigabytes of weights back, and
# an edit by hand changes the time). A folder is ptc's to replace only while the marker covers
# everything in it, unchanged.
OUTPUT_MARKER = ".ptc-output.json"


STAGING_MARKER = ".ptc-staging"


def _stamp(path: Path) -> list[int]:
    status = path.stat()
    return [status.st_size, status.st_mtime_ns]


def _tree(root: Path) -> tuple[list[str], list[str]]:
    """(files, other entries) under `root`, relative, never following a symlink."""
    files, others = [], []
    for folder, dirs, names in os.walk(root):
        base = Path(folder)
        for name in dirs + names:
            path = base / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                others.append(rel)
            elif path.is_file():
                files.append(rel)
            elif not any(path.iterdir()):
                others.append(rel)  # an empty folder: ptc writes none
    return sorted(files), sorted(others)


def mark_output(folder: Path) -> None:
    """Record every file under `folder` as ptc's (written last, once everything else is)."""
    files, _ = _tree(folder)
    record = {
        "format": "ptc-output",
        "version": 2,
        "files": {
            rel: _stamp(folder / rel) for rel in files if rel not in (OUTPUT_MARKER, STAGING_MARKER)
        },
    }
    write_json_atomic(folder / OUTPUT_MARKER, record)


def foreign_entries(folder: Path) -> list[str]:
    """What under `folder` ptc did not write, or that changed since: empty when the folder is
    wholly ptc's. A folder without ptc's output marker is foreign as a whole ('.')."""
    try:
        record = json.loads((folder / OUTPUT_MARKER).read_text())
        recorded = (
            record["files"]
            if record.get("format") == "ptc-output" and record.get("version") == 2
            else None
        )
    except (OSError, UnicodeDecodeError, ValueError, TypeError, KeyError, AttributeError):
        recorded = None
    if not isinstance(recorded, dict):
        return ["."]
    files, others = _tree(folder)
    foreign = [
        rel
        for rel in files
        if rel != OUTPUT_MARKER and (rel not in recorded or _stamp(folder / rel) != recorded[rel])
    ]
    return sorted(foreign + others)


def check_replaceable(folder: Path) -> None:
    """OutputError unless `folder` is missing, empty, or wholly what ptc wrote there."""
    from ptc.errors import OutputError

    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise OutputError(
            f"output {folder} exists and is not a folder ptc wrote; ptc replaces only its own outputs",
            "choose another output folder",
        )
    if not folder.is_dir() or not any(folder.iterdir()):
        return
    foreign = foreign_entries(folder)
    if foreign == ["."]:
        raise OutputError(
            f"output directory {folder} was not written by ptc (it has no {OUTPUT_MARKER}); "
            "--force replaces only ptc's own outputs",
            "choose another output folder, or move it away yourself",
        )
    if foreign:
        more = f" (and {len(foreign) - 1} more)" if len(foreign) > 1 else ""
        raise OutputError(
            f"output directory {folder} holds {foreign[0]}{more}, which ptc did not write or which "
            "changed since; --force replaces only what ptc wrote",
            "move those files out first",
        )


@contextlib.contextmanager
def staged_directory(final: Path, replace: bool, unmarked: bool = False) -> Iterator[Path]:
    """Yield an empty temporary sibling of `final`; on success mark it as ptc's output and
    rename it to `final`.

    On any exception the staging folder is removed and `final` is untouched. With `replace`,
    an existing `final` is swapped out only after the new one is complete, and only if it is
    wholly ptc's (`check_replaceable`). `unmarked` neither marks nor checks: for a folder in a
    tree its caller owns whole (the lab's zoo). A process killed outright leaves its staging
    folder (named with its pid, marked inside) behind; the next staging of the same output
    removes it.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(final.parent, final.name)
    staging = Path(
        tempfile.mkdtemp(
            dir=final.parent, prefix=f".{final.name}.{os.getpid()}.", suffix=".partial"
        )
    )
    try:
        (staging / STAGING_MARKER).write_text(f"{os.getpid()}\n")
        yield staging
        (staging / STAGING_MARKER).unlink()
        if not unmarked:
            mark_output(staging)
        share_tree(staging)
        if final.is_dir() and not final.is_symlink() and not any(final.iterdir()):
            final.rmdir()  # an empty folder is no output to protect
        if final.exists() or final.is_symlink():
            if not replace:
                raise FileExistsError(final)
            if not unmarked:
                check_replaceable(final)
            old = Path(
                tempfile.mkdtemp(
                    dir=final.parent, prefix=f".{final.name}.{os.getpid()}.", suffix=".old"
                )
            )
            os.replace(final, old)  # onto an empty folder of our own: a rename never merges
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
        fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def check_output_location(out: Path, protected: dict[str, Path]) -> None:
    """OutputError unless `out` can be written without touching what it must not: its path
    runs through folders (not a file), and it is neither inside nor around any `protected` path
    (the bank, the recipe, ...: `{"the bank": path}`)."""
    from ptc.errors import OutputError

    for ancestor in out.parents:
        if ancestor.exists() or ancestor.is_symlink():
            if not ancestor.is_dir():
                raise OutputError(
                    f"output {out}: {ancestor} is a file, not a folder",
                    "choose another output path",
                )
            break
    for what, path in protected.items():
        path = Path(path).resolve()
        if out == path or out.is_relative_to(path):
            raise OutputError(
                f"output {out} is inside {what} ({path})", f"write outputs outside {what}"
            )
        if path.is_relative_to(out):
            raise OutputError(
                f"output {out} contains {what} ({path}); replacing it would remove {what}",
                "choose an output folder of its own",
            )
