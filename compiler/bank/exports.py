"""The bank's exported base towers (`exports/<key>/`) kept as a cache that can be trimmed.

A real-size export is gigabytes (ViT-H/14's image tower alone is over 2 GB), and a new key is
written whenever the model, the exporter's version or the example shapes change, so old exports
pile up. Each folder records when it was last used (the mtime of its towers' sealed records,
touched on every use: the records' bytes never change) and the bank remembers which lock files
it built (`Bank.remember_lock`, `locks.json`), so pruning can go least recently used first and
leave alone every export a lock still names. What a lock names is the lock's business
(`recipe.lock.named_base_exports`); the bank keeps only the list of where the locks are.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from ptc.compiler.bank.store import Bank
from ptc.files import dead_writer, file_lock

PRUNED = "pruned"  # scratch folders .pruned.PID.*: exports moved out, being deleted


@dataclass(frozen=True)
class ExportFolder:
    """One exports/<key>/ folder: its towers, its bytes on disk and when it was last used."""

    key: str
    towers: tuple[str, ...]
    bytes: int
    last_used: float  # seconds since the epoch; 0.0 for a folder with no sealed tower


@dataclass(frozen=True)
class PrunePlan:
    remove: list[ExportFolder]
    keep_locked: list[ExportFolder]  # would have gone, but a lock names them
    bytes_before: int

    @property
    def bytes_after(self) -> int:
        return self.bytes_before - sum(folder.bytes for folder in self.remove)


def export_lock(bank: Bank, key: str, tower: str) -> Path:
    """The file lock held while an export is written, copied from, or removed."""
    return bank.root / ".locks" / f"export-{key}-{tower}.lock"


@contextmanager
def holding_export(bank: Bank, key: str, towers: tuple[str, ...]) -> Iterator[None]:
    with ExitStack() as stack:
        for tower in sorted(towers):  # one order everywhere, so two holders never deadlock
            stack.enter_context(file_lock(export_lock(bank, key, tower)))
        yield


def mark_used(bank: Bank, key: str, tower: str) -> None:
    """Stamp the export as used now. A bank shared read-only keeps its old stamps."""
    try:
        os.utime(bank.export_folder(key) / f"{tower}.json")
    except OSError:
        pass


def export_folders(bank: Bank) -> list[ExportFolder]:
    """Every export folder, least recently used first."""
    folders = []
    for folder in sorted(p for p in bank.root.glob("exports/*") if p.is_dir()):
        records = sorted(folder.glob("*.json"))
        folders.append(
            ExportFolder(
                key=folder.name,
                towers=tuple(p.stem for p in records),
                bytes=sum(p.stat().st_size for p in folder.iterdir() if p.is_file()),
                last_used=max((p.stat().st_mtime for p in records), default=0.0),
            )
        )
    return sorted(folders, key=lambda f: (f.last_used, f.key))


def plan_prune(
    folders: list[ExportFolder],
    locked: set[str],
    max_bytes: int | None,
    include_locked: bool = False,
) -> PrunePlan:
    """Which exports to remove: least recently used first, until the exports fit in
    `max_bytes` (None: every one that may go). An export a lock names stays unless asked."""
    total = sum(f.bytes for f in folders)
    remaining, remove, keep_locked = total, [], []
    for folder in folders:  # oldest first
        if max_bytes is not None and remaining <= max_bytes:
            break
        if folder.key in locked and not include_locked:
            keep_locked.append(folder)
            continue
        remove.append(folder)
        remaining -= folder.bytes
    return PrunePlan(remove, keep_locked, total)


def remove_export(bank: Bank, folder: ExportFolder) -> None:
    """Remove one export folder whole: moved out of exports/ in one rename while its towers'
    locks are held (a build copying from it finishes first), then deleted."""
    source = bank.export_folder(folder.key)
    with holding_export(bank, folder.key, folder.towers):
        bank.scratch.mkdir(parents=True, exist_ok=True)
        trash = Path(tempfile.mkdtemp(dir=bank.scratch, prefix=f".{PRUNED}.{os.getpid()}."))
        os.replace(source, trash / folder.key)
    shutil.rmtree(trash)


def sweep_pruned(bank: Bank) -> None:
    """Delete what a prune that died had moved out of exports/ but not yet deleted."""
    for trash in bank.scratch.glob(f".{PRUNED}.*"):
        if trash.is_dir() and dead_writer(trash, PRUNED):
            shutil.rmtree(trash, ignore_errors=True)
