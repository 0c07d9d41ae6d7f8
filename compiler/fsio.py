"""Atomic writes: everything lands under a temporary sibling and is renamed into place, so an
interrupted run leaves the old state or the new one, never a mixture."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator


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


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            os.fchmod(handle.fileno(), _file_mode())  # an inference server may run as another user
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def write_json_atomic(path: Path, obj) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8"))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner_dead(candidate: Path, name: str) -> bool:
    pid = candidate.name[len(name) + 2:].split(".", 1)[0]
    return pid.isdigit() and not _pid_alive(int(pid))


def remove_stale_staging(folder: Path, name: str) -> list[Path]:
    """Staging folders of `name` left by processes that died (SIGKILL, power loss)."""
    stale = [c for c in folder.glob(f".{name}.*.partial") if _owner_dead(c, name)]
    for candidate in stale:
        shutil.rmtree(candidate, ignore_errors=True)
    return stale


def remove_stale_temporaries(root: Path) -> list[Path]:
    """Half-written `.NAME.PID.RANDOM.tmp` files under `root` whose writer died."""
    stale = []
    for candidate in root.rglob(".*.tmp"):
        parts = candidate.name[1:-len(".tmp")].split(".")  # NAME may hold dots; PID is second to last
        if len(parts) >= 3 and parts[-2].isdigit() and not _pid_alive(int(parts[-2])):
            candidate.unlink(missing_ok=True)
            stale.append(candidate)
    return stale


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock (flock) on `path`, released on exit or process death."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


@contextlib.contextmanager
def staged_directory(final: Path, replace: bool) -> Iterator[Path]:
    """Yield an empty temporary sibling of `final`; on success rename it to `final`.

    On any exception the staging folder is removed and `final` is untouched. With `replace`,
    an existing `final` is swapped out only after the new one is complete. A process killed
    outright leaves its staging folder (named with its pid) behind; the next staging of the
    same output removes it.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(final.parent, final.name)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.{os.getpid()}.", suffix=".partial"))
    try:
        yield staging
        share_tree(staging)
        if final.is_dir() and not any(final.iterdir()):
            final.rmdir()  # an empty folder is no output to protect
        if final.exists():
            if not replace:
                raise FileExistsError(final)
            old = final.with_name(f".{final.name}.{os.getpid()}.old")
            os.replace(final, old)
            os.replace(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(staging, final)
        _fsync_dir(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
