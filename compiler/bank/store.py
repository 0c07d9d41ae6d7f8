"""The operator bank on disk: tasks, cached embeddings, descriptors, target factors and
operators. It knows files and hashes, not math.

Layout (every tensor entry is one safetensors file whose metadata holds a JSON record of
what it was made from and a hash of its tensors, checked on every read):

    bank.json                                      format marker
    tasks/<task>.json                              registered task: grid hash, probes, prompts
    embeddings/<model>/<grid>.safetensors          raw input and prompt embeddings of a model
    descriptors/<task>/<id>.safetensors            UTD (N x M) and the source's S_pre, with provenance
    factors/<target>/<grid>.safetensors            thin SVDs of the target's F and G
    operators/<target>/<grid>/<descriptor>-r<ridge>.safetensors   solved A (d x d, float32)
    checks/<model>/<check>.safetensors             a target's torch fp32 (z, R) of a check batch
    exports/<key>/<tower>.onnx, .onnx.data, .json  base towers' ONNX graphs, sealed (a cache)
    runtimes/<model>-<machine>.json                which runtime embeds a model faster here, sealed
    locks.json                                     the lock files builds from it wrote, sealed

<model> and <target> are model fingerprints (hashes of the weights), <grid> a grid hash.
Each record is bound to the key it is stored under (`entry`, sealed with the rest): an entry
swapped with another, renamed, or copied in from elsewhere under another key fails its check.
Temporaries are written in .tmp/, a folder only ptc writes, so clean-up never guesses.
"""

from __future__ import annotations

import difflib
import hashlib
import io
import json
import os
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptc import __version__
from ptc.compiler.tasks.grid import TaskSpec, check_name
from ptc.errors import BankError, TaskError
from ptc.files import (
    file_lock,
    file_sha256,
    remove_stale_temporaries,
    safetensors_header,
    write_bytes_atomic,
    write_json_atomic,
)
from ptc.finite import first_non_finite, require_finite
from ptc.hashing import tensors_sha256
from ptc.timers import timed

if TYPE_CHECKING:  # torch loads with the first tensor entry, not for `ptc task list`
    import torch

BANK_FORMAT = 3  # 2: every record sealed with record_sha256; 3: and bound to its key
UPGRADABLE_FORMATS = (2,)
MARKER, SCRATCH = "bank.json", ".tmp"
_REMEASURE_HINT = "delete it: the next build that embeds on `--embed-runtime auto` measures again"
LOCKS_FILE = (
    "locks.json"  # the lock files builds from this bank wrote (`ptc bank prune` keeps theirs)
)


def default_bank_dir() -> Path:
    return Path(os.environ.get("PTC_BANK") or Path.home() / ".cache" / "ptc" / "bank")


@dataclass(frozen=True)
class Entry:
    """One tensor entry of the bank: its tensors, its provenance record and content hash."""

    path: Path
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    sha256: str


@dataclass(frozen=True)
class TaskRecord:
    name: str
    grid_hash: str
    probes: tuple[Path, ...]
    classes: tuple[str, ...]
    templates: tuple[str, ...]
    source_file: str | None

    @property
    def spec(self) -> TaskSpec:
        return TaskSpec(self.name, self.probes, self.classes, self.templates)

    @property
    def prompts(self) -> list[str]:
        return self.spec.prompts


# Exports hashed whole in this process, by their files' size and mtime: a cold build reads the
# input tower's export twice (to embed with it, then to copy it), and hashing a ViT-H/14 image
# tower (2.5 GB) takes about 2 s a time at the 1.1 GB/s measured here. A file rewritten since has another stamp and is hashed again.
_EXPORTS_VERIFIED: set[tuple[object, ...]] = set()


def _file_stamp(file: Path) -> tuple[int, int]:
    try:
        info = file.stat()
    except OSError:
        return (-1, -1)  # missing: hashed, and reported
    return (info.st_size, info.st_mtime_ns)


def _sealed(record: dict[str, Any]) -> dict[str, Any]:
    """The record with `record_sha256` over its canonical JSON: any changed byte shows."""
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return {
        **body,
        "record_sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest(),
    }


def _seal_intact(record: dict[str, Any]) -> bool:
    return isinstance(record, dict) and _sealed(record).get("record_sha256") == record.get(
        "record_sha256"
    )


class Bank:
    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()
        self._format_checked = False

    @property
    def scratch(self) -> Path:
        return self.root / SCRATCH

    def _check_folder(self) -> None:
        """A path that is not a bank is refused before anything in it is read or touched: a
        file, or a folder with content but no bank marker. Missing or empty: a new bank."""
        if self.root.exists() and not self.root.is_dir():
            raise BankError(
                f"bank path {self.root} is a file, not a folder", "point --bank at a bank folder"
            )
        if (
            self.root.is_dir()
            and not (self.root / MARKER).exists()
            and any(p.name not in (SCRATCH, ".locks") for p in self.root.iterdir())
        ):
            raise BankError(
                f"{self.root} is not a ptc bank (it has no {MARKER}) and is not empty; ptc will not "
                "write into it or clean it up",
                "point --bank at a bank, or at a new folder",
            )

    def _marker_version(self) -> Any:
        marker = self.root / MARKER
        try:
            record = json.loads(marker.read_text())
            if record.get("format") != "ptc-bank":
                raise ValueError("not a ptc bank marker")
            return record.get("version")
        except (OSError, UnicodeDecodeError, ValueError, AttributeError):
            raise BankError(f"bank marker {marker} is corrupt", "run `ptc bank verify`") from None

    def _check_format(self) -> None:
        """A bank written by another format version is refused before any entry is trusted."""
        if self._format_checked:
            return
        self._check_folder()
        if (self.root / MARKER).exists():
            version = self._marker_version()
            if version in UPGRADABLE_FORMATS:
                raise BankError(
                    f"bank {self.root} has format {version}; this ptc reads format {BANK_FORMAT}",
                    f"run `ptc bank upgrade --bank {self.root}` once (it re-seals every entry)",
                )
            if version != BANK_FORMAT:
                raise BankError(
                    f"bank {self.root} has format {version}; this ptc reads format {BANK_FORMAT}",
                    "rebuild the bank with this version (ptc task add, descriptor add)",
                )
        self._format_checked = True

    # -- generic tensor entries -------------------------------------------------------------
    def _ensure(self) -> None:
        self._check_format()
        marker = self.root / MARKER
        if not marker.exists():
            write_json_atomic(marker, {"format": "ptc-bank", "version": BANK_FORMAT}, self.scratch)

    def write_entry(
        self, relpath: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
    ) -> Entry:
        import safetensors.torch

        tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        # The last gate before the bank: whatever computed these, nothing non-finite is stored.
        require_finite(
            tensors,
            f"{meta.get('kind', 'entry')} for the bank entry {relpath}",
            "nothing was stored; the numbers it was computed from overflow",
        )
        self._ensure()
        sha = tensors_sha256(tensors)
        record = _sealed(
            {**meta, "entry": relpath, "tensors_sha256": sha, "ptc_version": __version__}
        )
        # One metadata key only: safetensors writes its metadata map in hash order, which
        # changes from process to process, and bank entries must be byte-reproducible.
        data = safetensors.torch.save(tensors, metadata={"ptc": json.dumps(record, sort_keys=True)})
        path = self.root / relpath
        with timed("bank_write"):
            write_bytes_atomic(path, data, self.scratch)
        return Entry(path, tensors, record, sha)

    def read_entry(self, relpath: str) -> Entry | None:
        self._check_format()
        entry = self._read_sealed(relpath)
        if entry is not None and entry.meta.get("entry") != relpath:
            raise BankError(
                f"bank entry {entry.path} holds the record of {str(entry.meta.get('entry'))!r}, not of "
                f"{relpath!r}: it was swapped, renamed or copied in from elsewhere",
                f"delete it and recompute, or run `ptc bank verify --bank {self.root}`",
            )
        return entry

    def _read_sealed(self, relpath: str) -> Entry | None:
        """The entry at `relpath` with its seal and content hash checked (not yet its key)."""
        import safetensors.torch

        path = self.root / relpath
        try:
            with timed("bank_read"):
                data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise BankError(
                f"bank entry {path} cannot be read: {exc.strerror}",
                "it must be a file ptc wrote; delete it and recompute",
            ) from None
        try:
            record = json.loads(
                safetensors_header(io.BytesIO(data), len(data))["__metadata__"]["ptc"]
            )
            tensors = safetensors.torch.load(data)
        except Exception as exc:  # any parse failure means the file is not what we wrote
            raise BankError(
                f"bank entry {path} is corrupt: {exc}",
                f"delete it and recompute, or run `ptc bank verify --bank {self.root}`",
            ) from None
        sha = tensors_sha256(tensors)
        if (
            not isinstance(record, dict)
            or sha != record.get("tensors_sha256")
            or not _seal_intact(record)
        ):
            recorded = record.get("tensors_sha256") if isinstance(record, dict) else None
            raise BankError(
                f"bank entry {path} failed its integrity check (content hash {sha[:12]} "
                f"!= recorded {str(recorded)[:12]})",
                "the file was modified or damaged; delete it and recompute",
            )
        bad = first_non_finite(tensors)
        if bad is not None:
            raise BankError(
                f"bank entry {path}: tensor {bad[0]!r} holds NaN or Inf ({bad[1]:,} of {bad[2]:,} values)",
                "delete it and recompute",
            )
        return Entry(path, tensors, record, sha)

    def get_or_compute(
        self, relpath: str, compute: Callable[[], tuple[dict[str, torch.Tensor], dict[str, Any]]]
    ) -> tuple[Entry, bool]:
        """The entry at `relpath`, or `compute() -> (tensors, meta)` written there.

        The check, the computation and the write happen under a per-entry file lock, so two
        processes sharing a bank compute a shared entry once: the second finds it written."""
        entry = self.read_entry(relpath)
        if entry is not None:
            return entry, False
        self._ensure()
        with self.lock(relpath):
            entry = self.read_entry(relpath)
            if entry is not None:
                return entry, False
            tensors, meta = compute()
            return self.write_entry(relpath, tensors, meta), True

    def lock(self, name: str) -> AbstractContextManager[None]:
        """An exclusive lock on `name` between the processes sharing this bank."""
        digest = hashlib.sha256(name.encode()).hexdigest()[:32]
        return file_lock(self.root / ".locks" / f"{digest}.lock")

    # -- tasks --------------------------------------------------------------------------------
    def _task_path(self, name: str) -> Path:
        return self.root / "tasks" / f"{check_name('task', name)}.json"

    def task_names(self) -> list[str]:
        self._check_format()
        return sorted(p.stem for p in (self.root / "tasks").glob("*.json"))

    def add_task(self, spec: TaskSpec, replace: bool = False) -> tuple[TaskRecord, bool]:
        """Register a task; returns (record, changed). Refuses to silently change a grid."""
        grid = spec.grid_hash()
        existing = self._task_path(spec.name)
        if existing.exists():
            old = self.task(spec.name)
            if old.grid_hash == grid:
                return old, False
            if not replace:
                raise BankError(
                    f"task {spec.name!r} is already registered with another grid "
                    f"({old.grid_hash[:12]} != {grid[:12]}); its descriptors were made on the old one",
                    "pass --replace to re-register it, then recompute its descriptors",
                )
        self._ensure()
        # Probe paths are stored absolute and relative to the bank: a bank committed next to its
        # probes (the zoo's) reads from any checkout, and a bank copied alone still finds them.
        # The grid hash pins their bytes either way.
        record = {
            "name": spec.name,
            "grid_hash": grid,
            "probes": [str(Path(p).resolve()) for p in spec.probes],
            "probes_from_bank": [self._relative(p) for p in spec.probes],
            "classes": list(spec.classes),
            "templates": list(spec.templates),
            "source_file": str(spec.source_file) if spec.source_file else None,
        }
        write_json_atomic(existing, _sealed(record), self.scratch)
        return self.task(spec.name), True

    def _relative(self, path: Path) -> str:
        return os.path.relpath(Path(path).resolve(), self.root.resolve())

    def _locate(self, absolute: str, relative: str) -> Path:
        """The probe next to the bank where it is there (the tree moved together), else where
        it was registered."""
        beside = Path(os.path.normpath(self.root / relative))
        return beside if beside.is_file() else Path(absolute)

    def task(self, name: str) -> TaskRecord:
        self._check_format()
        path = self._task_path(name)
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            raise BankError(
                f"task {name!r} is not registered in the bank {self.root}",
                _suggest(name, self.task_names(), "register it with `ptc task add TASK.yaml`"),
            ) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BankError(
                f"bank task record {path} is corrupt: {exc}", "re-register it with `ptc task add`"
            ) from None
        if not _seal_intact(record):
            raise BankError(
                f"bank task record {path} failed its integrity check",
                "the file was modified or damaged; re-register it with `ptc task add --replace`",
            )
        if record.get("name") != name:  # the record names its task: a renamed or swapped file shows
            raise BankError(
                f"bank task record {path} is the record of task {record.get('name')!r}",
                "it was renamed or swapped; re-register the task with `ptc task add --replace`",
            )
        probes = tuple(
            self._locate(absolute, relative)
            for absolute, relative in zip(
                record["probes"], record.get("probes_from_bank") or record["probes"]
            )
        )
        return TaskRecord(
            record["name"],
            record["grid_hash"],
            probes,
            tuple(record["classes"]),
            tuple(record["templates"]),
            record.get("source_file"),
        )

    # -- descriptors --------------------------------------------------------------------------
    @staticmethod
    def _descriptor_rel(task: str, descriptor_id: str) -> str:
        return f"descriptors/{check_name('task', task)}/{check_name('descriptor', descriptor_id)}.safetensors"

    def descriptor_ids(self, task: str) -> list[str]:
        self._check_format()
        return sorted(p.stem for p in (self.root / "descriptors" / task).glob("*.safetensors"))

    def put_descriptor(
        self, task: str, descriptor_id: str, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
    ) -> Entry:
        """`tensors` holds "utd" (N x M) and, from ptc 0.2 on, "source_affinity" (the source's S_pre)."""
        return self.write_entry(self._descriptor_rel(task, descriptor_id), tensors, meta)

    def descriptor(self, task: str, descriptor_id: str) -> Entry:
        entry = self.read_entry(self._descriptor_rel(task, descriptor_id))
        if entry is None:
            raise BankError(
                f"no descriptor {descriptor_id!r} for task {task!r} in the bank {self.root}",
                _suggest(
                    descriptor_id,
                    self.descriptor_ids(task),
                    "add it with `ptc descriptor add --task ... --source ... --finetuned ...`",
                ),
            )
        return entry

    # -- caches keyed by model fingerprint ----------------------------------------------------
    @staticmethod
    def embeddings_rel(model_fp: str, grid: str) -> str:
        return f"embeddings/{model_fp}/{grid}.safetensors"

    @staticmethod
    def factors_rel(target_fp: str, grid: str) -> str:
        return f"factors/{target_fp}/{grid}.safetensors"

    @staticmethod
    def operator_rel(target_fp: str, grid: str, descriptor_sha: str, ridge: float) -> str:
        return f"operators/{target_fp}/{grid}/{descriptor_sha[:32]}-r{ridge!r}.safetensors"

    @staticmethod
    def check_rel(model_fp: str, check: str) -> str:
        return f"checks/{model_fp}/{check}.safetensors"

    # -- base towers exported to ONNX (compiler/export/tower_cache.py) --------------------------------------
    # exports/<key>/<tower>.onnx (and .onnx.data), complete once its sealed record
    # <tower>.json, written last, names the entry and every file's sha256.
    def export_folder(self, key: str) -> Path:
        return self.root / "exports" / key

    def prepare_export(self, key: str) -> Path:
        """The folder an export is written into, in a bank that exists (marker written)."""
        self._ensure()
        return self.export_folder(key)

    def seal_export(self, key: str, tower: str, files: list[Path]) -> None:
        record = _sealed(
            {
                "kind": "export",
                "entry": f"exports/{key}/{tower}",
                "ptc_version": __version__,
                "files": {path.name: file_sha256(path) for path in files},
            }
        )
        write_json_atomic(self.export_folder(key) / f"{tower}.json", record, self.scratch)

    def export_problem(self, key: str, tower: str) -> str | None:
        """None when the export exports/<key>/<tower> is complete and intact; else what is wrong."""
        path = self.export_folder(key) / f"{tower}.json"
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return f"bank export {path.parent / tower}.onnx is missing or incomplete"
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return f"bank export record {path} is corrupt: {exc}"
        if (
            not _seal_intact(record)
            or record.get("entry") != f"exports/{key}/{tower}"
            or not isinstance(record.get("files"), dict)
        ):
            return f"bank export record {path} failed its integrity check (modified, or copied from elsewhere)"
        files = [path.parent / str(name) for name in record["files"]]
        stamp = (str(path), record["record_sha256"], *(_file_stamp(file) for file in files))
        if stamp in _EXPORTS_VERIFIED:
            return None
        with timed("hash_exports"):
            for file, sha in zip(files, record["files"].values()):
                if not file.is_file() or file_sha256(file) != sha:
                    return f"bank export {file} does not match its record (modified or damaged)"
        _EXPORTS_VERIFIED.add(stamp)
        return None

    # -- embedding runtimes measured per model and machine (compiler/export/runtime_speed.py) ---
    # runtimes/<key>.json: a sealed record of both runtimes' images/s and the one chosen.
    def runtime_speed(self, key: str) -> dict[str, Any] | None:
        """The sealed runtime record under `key`, None where there is none; a damaged one is a
        BankError (the choice names the cached embeddings' key, so it is never guessed)."""
        path = self.root / "runtimes" / f"{key}.json"
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise BankError(
                f"bank runtime record {path} is corrupt: {exc}", _REMEASURE_HINT
            ) from None
        if (
            not _seal_intact(record)
            or record.get("entry") != f"runtimes/{key}"
            or record.get("chosen") not in ("torch", "onnxruntime")
        ):
            raise BankError(
                f"bank runtime record {path} failed its integrity check (modified, or copied "
                "from elsewhere)",
                _REMEASURE_HINT,
            )
        return dict(record)

    def put_runtime_speed(self, key: str, record: dict[str, Any]) -> None:
        self._ensure()
        sealed = _sealed({"kind": "runtime", "entry": f"runtimes/{key}", **record})
        write_json_atomic(self.root / "runtimes" / f"{key}.json", sealed, self.scratch)

    def _runtime_problems(self) -> tuple[int, list[str]]:
        records = sorted(self.root.glob("runtimes/*.json"))
        problems = []
        for path in records:
            try:
                self.runtime_speed(path.stem)
            except BankError as exc:
                problems.append(exc.message)
        return len(records), problems

    # -- the locks built from this bank (compiler/bank/exports.py prunes around them) ------------
    # locks.json: a sealed record of the lock files' absolute paths.
    def remember_lock(self, lock_path: Path) -> None:
        """Add a lock file built from this bank to its list, once. A read-only bank, or a list
        that fails its check (left for `ptc bank verify` to report), is left as it is."""
        path = str(Path(lock_path).resolve())
        try:
            with file_lock(self.root / ".locks" / "locks.lock"):
                known = self.remembered_locks()
                if path not in known:
                    record = _sealed({"kind": "locks", "locks": sorted([*known, path])})
                    write_json_atomic(self.root / LOCKS_FILE, record, self.scratch)
        except (OSError, BankError):
            pass

    def remembered_locks(self) -> list[str]:
        """The lock files builds from this bank wrote (some may since have been deleted)."""
        problem = self._locks_problem()
        if problem is not None:
            raise BankError(
                problem,
                "delete it: each later build lists its lock again (until then `ptc bank prune`"
                " cannot tell which exports a lock names, and refuses)",
            )
        try:
            return list(json.loads((self.root / LOCKS_FILE).read_text(encoding="utf-8"))["locks"])
        except FileNotFoundError:
            return []

    def _locks_problem(self) -> str | None:
        path = self.root / LOCKS_FILE
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            return f"bank lock list {path} is corrupt: {exc}"
        if (
            not _seal_intact(record)
            or record.get("kind") != "locks"
            or not all(isinstance(p, str) for p in record.get("locks", [None]))
        ):
            return f"bank lock list {path} failed its integrity check (modified or damaged)"
        return None

    def _export_problems(self) -> tuple[int, list[str]]:
        records = sorted(self.root.glob("exports/*/*.json"))
        found = [self.export_problem(path.parent.name, path.stem) for path in records]
        return len(records), [problem for problem in found if problem is not None]

    # -- maintenance --------------------------------------------------------------------------
    def exists(self) -> bool:
        """Whether a bank was ever written here (its marker)."""
        return (self.root / MARKER).is_file()

    def entry_paths(self) -> list[str]:
        """Every tensor entry, relative to the root (temporaries left out)."""
        return [
            str(p.relative_to(self.root))
            for p in sorted(self.root.rglob("*.safetensors"))
            if not p.name.startswith(".") and SCRATCH not in p.relative_to(self.root).parts
        ]

    def entry_record(self, relpath: str) -> dict[str, Any]:
        """An entry's sealed record, read off its header alone (no tensor read, nothing checked:
        `verify_all` checks); {"unreadable": why} for a file that is not an entry ptc wrote."""
        path = self.root / relpath
        try:
            with path.open("rb") as handle:
                return json.loads(
                    safetensors_header(handle, path.stat().st_size)["__metadata__"]["ptc"]
                )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return {"unreadable": f"{type(exc).__name__}: {exc}"}

    def verify_all(self) -> tuple[int, list[str]]:
        """Re-hash every entry and check it against its key and its task; return (entries
        checked, problems). A folder that is not a bank is refused before anything is touched;
        then temporaries of writers that died are removed from .tmp/ (never part of the bank)."""
        self._check_folder()
        try:
            self._check_format()
        except BankError as exc:  # a damaged or outdated marker: reported, nothing touched
            return 1, [exc.message]
        remove_stale_temporaries(self.scratch)
        problems, count = [], 0
        for name in self.task_names():
            count += 1
            try:
                self.task(name)
            except BankError as exc:
                problems.append(exc.message)
        for relpath in self.entry_paths():
            count += 1
            try:
                entry = self.read_entry(relpath)
                if entry is not None:  # None: removed since it was listed
                    problems += self._cross_check(entry)
            except BankError as exc:
                problems.append(exc.message)
        exports, export_problems = self._export_problems()
        runtimes, runtime_problems = self._runtime_problems()
        locks = self._locks_problem()
        export_problems += [locks] if locks is not None else []
        return count + exports + runtimes, problems + export_problems + runtime_problems

    def _cross_check(self, entry: Entry) -> list[str]:
        """A descriptor made on another grid than its task's (copied in from another bank)."""
        if entry.meta.get("kind") != "descriptor":
            return []
        try:
            grid = self.task(str(entry.meta.get("task"))).grid_hash
        except (BankError, TaskError):
            return [
                f"bank entry {entry.path}: its task {entry.meta.get('task')!r} is not registered here"
            ]
        if entry.meta.get("grid_hash") != grid:
            return [
                f"bank entry {entry.path} was made on grid {str(entry.meta.get('grid_hash'))[:12]}, but task "
                f"{entry.meta.get('task')!r} here has grid {grid[:12]} (copied from another bank?)"
            ]
        return []

    def upgrade(self) -> tuple[int, list[str]]:
        """Re-seal a format-2 bank's entries bound to their keys (format 3); returns (entries
        re-sealed, problems). An entry that fails its old check is reported and left as it is,
        and the bank stays at format 2 until every entry passes."""
        self._check_folder()
        if not (self.root / MARKER).is_file():
            raise BankError(
                f"{self.root} is not a ptc bank (it has no {MARKER})",
                "point --bank at a bank folder",
            )
        version = self._marker_version()
        if version == BANK_FORMAT:
            return 0, []
        if version not in UPGRADABLE_FORMATS:
            raise BankError(
                f"bank {self.root} has format {version}; ptc upgrades only format "
                f"{', '.join(map(str, UPGRADABLE_FORMATS))}"
            )
        entries, problems = [], []
        for relpath in self.entry_paths():
            try:
                sealed = self._read_sealed(relpath)
                if sealed is not None:  # None: removed since it was listed
                    entries.append((relpath, sealed))
            except BankError as exc:
                problems.append(exc.message)
        if problems:
            return 0, problems
        self._format_checked = True  # the checks above are format 2's; write as format 3
        for relpath, entry in entries:
            meta = {
                k: v
                for k, v in entry.meta.items()
                if k not in ("record_sha256", "tensors_sha256", "ptc_version")
            }
            self.write_entry(relpath, entry.tensors, meta)
        write_json_atomic(
            self.root / MARKER, {"format": "ptc-bank", "version": BANK_FORMAT}, self.scratch
        )
        return len(entries), []


def _suggest(name: str, known: list[str], otherwise: str) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    if known:
        return f"known: {', '.join(known[:10])}{' ...' if len(known) > 10 else ''}; {otherwise}"
    return otherwise
