"""Files written so that an interrupted run leaves the old state or the new one, never a
mixture: atomic writes through a temporary sibling, fsync, shared-folder modes, per-entry file
locks, and reading back what ptc wrote (JSON, safetensors headers, sha256)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO


def fsync_dir(folder: Path) -> None:
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
    fsync_dir(path.parent)


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


def dead_writer(candidate: Path, name: str) -> bool:
    pid = _pid_in_name(candidate, name)
    return pid is not None and not _pid_alive(pid)


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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 22), b""):
            digest.update(chunk)
    return digest.hexdigest()


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` between processes, released on exit or process death
    (filelock: flock on POSIX, msvcrt on Windows)."""
    from filelock import FileLock

    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path)):
        yield


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
