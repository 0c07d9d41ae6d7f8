"""Atomic writes: everything lands under a temporary sibling and is renamed into place, so an
interrupted run leaves the old state or the new one, never a mixture."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
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


def write_bytes_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
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


@contextlib.contextmanager
def staged_directory(final: Path, replace: bool) -> Iterator[Path]:
    """Yield an empty temporary sibling of `final`; on success rename it to `final`.

    On any exception the staging folder is removed and `final` is untouched. With `replace`,
    an existing `final` is swapped out only after the new one is complete.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.", suffix=".partial"))
    try:
        yield staging
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
