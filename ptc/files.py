"""Atomic writes: everything lands under a temporary sibling and is renamed into place, so an
interrupted run leaves the old state or the new one, never a mixture."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    """The process's umask, read without changing it where Linux allows (os.umask can only
    set it, which would race with other threads creating files)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _file_mode() -> int:
    """What open() would give a new file: mkstemp makes it owner-only (0600)."""
    return 0o666 & ~_umask()


def share_tree(root: Path) -> None:
    """Give every entry under `root` (and `root`) the read bits, and folders the search bits,
    that the umask allows others: mkdtemp makes owner-only folders, and some writers make
    owner-only files (safetensors 0.8's save_file writes 0600). Other bits are kept."""
    readable = 0o444 & ~_umask()
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        wanted = mode | readable | ((readable >> 2) if path.is_dir() else 0)  # r -> x on folders
        if wanted != mode:
            os.chmod(path, stat.S_IMODE(wanted))


@contextlib.contextmanager
def atomic_file(path: Path, scratch: Path | None = None) -> Iterator[BinaryIO]:
    """A binary handle on a temporary file that is renamed onto `path` when the block ends
    without an exception (and removed when it raises). The temporary lies in `scratch` (a
    folder of ptc's own on the same file system, so that clean-up never has to guess which
    files are ptc's), else beside `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = scratch if scratch is not None else path.parent
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _file_mode())  # an inference server may run as another user
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def write_bytes_atomic(path: Path, data: bytes, scratch: Path | None = None) -> None:
    """Write `data` to `path` through a temporary file renamed into place (`atomic_file`)."""
    with atomic_file(path, scratch) as handle:
        handle.write(data)


def safetensors_header(handle: BinaryIO, size: int) -> dict[str, Any]:
    """The JSON header of a safetensors stream of `size` bytes (a little-endian u64 length, then
    the header), leaving the handle at the first data byte; ValueError when truncated.
    safetensors' own API reads the metadata but not the data offsets, which a header rewrite
    (stamping provenance) has to keep."""
    import struct

    (length,) = struct.unpack("<Q", handle.read(8))
    if length > size - 8:
        raise ValueError("header length exceeds file size (truncated file)")
    return json.loads(handle.read(length))


def write_json_atomic(path: Path, obj: Any, scratch: Path | None = None) -> None:
    write_bytes_atomic(
        path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"), scratch
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _pid_in_name(candidate: Path, name: str) -> int | None:
    pid = candidate.name[len(name) + 2 :].split(".", 1)[0]
    return int(pid) if pid.isdigit() else None


def _dead_writer(candidate: Path, name: str) -> bool:
    pid = _pid_in_name(candidate, name)
    return pid is not None and not _pid_alive(pid)


def remove_stale_staging(folder: Path, name: str) -> list[Path]:
    """Staging and swap folders of output `name` left by processes that died (SIGKILL, power
    loss). Only folders that are provably ptc's go: a staging folder carrying ptc's staging
    marker (or still empty), an old output swapped aside that ptc's output marker covers whole.
    A folder of someone else's that merely matches the name pattern is left alone."""
    stale: list[Path] = []
    for candidate in sorted(folder.glob(f".{name}.*.partial")) + sorted(
        folder.glob(f".{name}.*.old")
    ):
        if candidate.is_symlink() or not candidate.is_dir() or not _dead_writer(candidate, name):
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


def remove_stale_temporaries(scratch: Path) -> list[Path]:
    """Half-written `.NAME.PID.RANDOM.tmp` files whose writer died, in `scratch` only: a folder
    that ptc alone writes temporaries into (the bank's .tmp/), never a user's folder."""
    stale: list[Path] = []
    if not scratch.is_dir():
        return stale
    for candidate in scratch.glob(".*.tmp"):
        # NAME may hold dots; PID is second to last
        parts = candidate.name[1 : -len(".tmp")].split(".")
        if (
            candidate.is_file()
            and len(parts) >= 3
            and parts[-2].isdigit()
            and not _pid_alive(int(parts[-2]))
        ):
            candidate.unlink(missing_ok=True)
            stale.append(candidate)
    return stale


# -- ownership of output folders -----------------------------------------------------------------
# Every folder staged_directory writes ends with OUTPUT_MARKER: the size and modification time of
# every file ptc put there (not a hash: a warm rebuild must not read gigabytes of weights back, and
# an edit by hand changes the time). A folder is ptc's to replace only while the marker covers
# everything in it, unchanged.
OUTPUT_MARKER = ".ptc-output.json"
STAGING_MARKER = ".ptc-staging"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` between processes, released on exit or process death
    (filelock: flock on POSIX, msvcrt on Windows)."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


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
        _fsync_dir(final.parent)
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


def read_json_file(path: Path, what: str) -> Any:
    """A JSON file ptc wrote (a report, a lock), or OutputError naming it: a corrupt one is bad
    input, not a crash."""
    from ptc.errors import OutputError

    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise OutputError(
            f"{path}: cannot read the {what}: {exc}".split("\n")[0],
            "the output folder is damaged; rebuild it",
        ) from None
