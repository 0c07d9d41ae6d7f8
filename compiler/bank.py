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

<model> and <target> are model fingerprints (hashes of the weights), <grid> a grid hash.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import safetensors.torch
import torch

from . import __version__
from .errors import BankError
from .fsio import file_lock, remove_stale_temporaries, write_bytes_atomic, write_json_atomic
from .grid import TaskSpec, check_name
from .hashing import tensors_sha256
from .timers import timed

BANK_FORMAT = 2  # 2: every record sealed with record_sha256


def default_bank_dir() -> Path:
    return Path(os.environ.get("PTC_BANK") or Path.home() / ".cache" / "ptc" / "bank")


@dataclass(frozen=True)
class Entry:
    """One tensor entry of the bank: its tensors, its provenance record and content hash."""

    path: Path
    tensors: dict[str, torch.Tensor]
    meta: dict
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


def _sealed(record: dict) -> dict:
    """The record with `record_sha256` over its canonical JSON: any changed byte shows."""
    body = {k: v for k, v in record.items() if k != "record_sha256"}
    return {**body, "record_sha256": hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()}


def _seal_intact(record: dict) -> bool:
    return isinstance(record, dict) and _sealed(record).get("record_sha256") == record.get("record_sha256")


def _read_header(data: bytes) -> dict:
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise ValueError("header length exceeds file size (truncated file)")
    return json.loads(data[8:8 + length])


class Bank:
    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()
        self._format_checked = False

    def _check_format(self) -> None:
        """A bank written by another format version is refused before any entry is trusted."""
        if self._format_checked:
            return
        marker = self.root / "bank.json"
        if marker.exists():
            try:
                version = json.loads(marker.read_text()).get("version")
            except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
                raise BankError(f"bank marker {marker} is corrupt", "run `ptc bank verify`") from None
            if version != BANK_FORMAT:
                raise BankError(f"bank {self.root} has format {version}; this ptc reads format {BANK_FORMAT}",
                                "rebuild the bank with this version (ptc task add, descriptor add)")
        self._format_checked = True

    # -- generic tensor entries -------------------------------------------------------------
    def _ensure(self) -> None:
        self._check_format()
        marker = self.root / "bank.json"
        if not marker.exists():
            write_json_atomic(marker, {"format": "ptc-bank", "version": BANK_FORMAT})

    def write_entry(self, relpath: str, tensors: dict[str, torch.Tensor], meta: dict) -> Entry:
        self._ensure()
        tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        sha = tensors_sha256(tensors)
        record = _sealed({**meta, "tensors_sha256": sha, "ptc_version": __version__})
        # One metadata key only: safetensors writes its metadata map in hash order, which
        # changes from process to process, and bank entries must be byte-reproducible.
        data = safetensors.torch.save(tensors, metadata={"ptc": json.dumps(record, sort_keys=True)})
        path = self.root / relpath
        with timed("bank_write"):
            write_bytes_atomic(path, data)
        return Entry(path, tensors, record, sha)

    def read_entry(self, relpath: str) -> Entry | None:
        self._check_format()
        path = self.root / relpath
        try:
            with timed("bank_read"):
                data = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            record = json.loads(_read_header(data)["__metadata__"]["ptc"])
            tensors = safetensors.torch.load(data)
        except Exception as exc:  # any parse failure means the file is not what we wrote
            raise BankError(f"bank entry {path} is corrupt: {exc}",
                            f"delete it and recompute, or run `ptc bank verify --bank {self.root}`") from None
        sha = tensors_sha256(tensors)
        if sha != record.get("tensors_sha256") or not _seal_intact(record):
            raise BankError(f"bank entry {path} failed its integrity check (content hash {sha[:12]} "
                            f"!= recorded {str(record.get('tensors_sha256'))[:12]})",
                            "the file was modified or damaged; delete it and recompute")
        for name, tensor in tensors.items():
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                raise BankError(f"bank entry {path}: tensor {name!r} holds NaN or Inf",
                                "delete it and recompute")
        return Entry(path, tensors, record, sha)

    def get_or_compute(self, relpath: str, compute) -> tuple[Entry, bool]:
        """The entry at `relpath`, or `compute() -> (tensors, meta)` written there.

        The check, the computation and the write happen under a per-entry file lock, so two
        processes sharing a bank compute a shared entry once: the second finds it written."""
        entry = self.read_entry(relpath)
        if entry is not None:
            return entry, False
        self._ensure()
        digest = hashlib.sha256(relpath.encode()).hexdigest()[:32]
        with file_lock(self.root / ".locks" / f"{digest}.lock"):
            entry = self.read_entry(relpath)
            if entry is not None:
                return entry, False
            tensors, meta = compute()
            return self.write_entry(relpath, tensors, meta), True

    # -- tasks --------------------------------------------------------------------------------
    def _task_path(self, name: str) -> Path:
        return self.root / "tasks" / f"{check_name('task', name)}.json"

    def task_names(self) -> list[str]:
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
                raise BankError(f"task {spec.name!r} is already registered with another grid "
                                f"({old.grid_hash[:12]} != {grid[:12]}); its descriptors were made on the old one",
                                "pass --replace to re-register it, then recompute its descriptors")
        self._ensure()
        # Probe paths are stored absolute and relative to the bank: a bank committed next to its
        # probes (the zoo's) reads from any checkout, and a bank copied alone still finds them.
        # The grid hash pins their bytes either way.
        record = {"name": spec.name, "grid_hash": grid, "probes": [str(Path(p).resolve()) for p in spec.probes],
                  "probes_from_bank": [self._relative(p) for p in spec.probes],
                  "classes": list(spec.classes), "templates": list(spec.templates),
                  "source_file": str(spec.source_file) if spec.source_file else None}
        write_json_atomic(existing, _sealed(record))
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
            raise BankError(f"task {name!r} is not registered in the bank {self.root}",
                            _suggest(name, self.task_names(), "register it with `ptc task add TASK.yaml`")) from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BankError(f"bank task record {path} is corrupt: {exc}", "re-register it with `ptc task add`") from None
        if not _seal_intact(record):
            raise BankError(f"bank task record {path} failed its integrity check",
                            "the file was modified or damaged; re-register it with `ptc task add --replace`")
        probes = tuple(self._locate(absolute, relative) for absolute, relative in
                       zip(record["probes"], record.get("probes_from_bank") or record["probes"]))
        return TaskRecord(record["name"], record["grid_hash"], probes,
                          tuple(record["classes"]), tuple(record["templates"]), record.get("source_file"))

    # -- descriptors --------------------------------------------------------------------------
    @staticmethod
    def _descriptor_rel(task: str, descriptor_id: str) -> str:
        return f"descriptors/{check_name('task', task)}/{check_name('descriptor', descriptor_id)}.safetensors"

    def descriptor_ids(self, task: str) -> list[str]:
        return sorted(p.stem for p in (self.root / "descriptors" / task).glob("*.safetensors"))

    def put_descriptor(self, task: str, descriptor_id: str, tensors: dict[str, torch.Tensor], meta: dict) -> Entry:
        """`tensors` holds "utd" (N x M) and, from ptc 0.2 on, "source_affinity" (the source's S_pre)."""
        return self.write_entry(self._descriptor_rel(task, descriptor_id), tensors, meta)

    def descriptor(self, task: str, descriptor_id: str) -> Entry:
        entry = self.read_entry(self._descriptor_rel(task, descriptor_id))
        if entry is None:
            raise BankError(f"no descriptor {descriptor_id!r} for task {task!r} in the bank {self.root}",
                            _suggest(descriptor_id, self.descriptor_ids(task),
                                     "add it with `ptc descriptor add --task ... --source ... --finetuned ...`"))
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

    # -- maintenance --------------------------------------------------------------------------
    def verify_all(self) -> tuple[int, list[str]]:
        """Re-hash every tensor entry; return (entries checked, problems). Temporary files of
        writers that died are removed first: they were never part of the bank."""
        remove_stale_temporaries(self.root)
        problems, count = [], 0
        try:
            marker = json.loads((self.root / "bank.json").read_text())
            if marker.get("format") != "ptc-bank":
                problems.append(f"{self.root / 'bank.json'}: not a ptc bank marker")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            problems.append(f"{self.root / 'bank.json'} is corrupt: {exc}")
        for name in self.task_names():
            count += 1
            try:
                self.task(name)
            except BankError as exc:
                problems.append(exc.message)
        for path in sorted(self.root.rglob("*.safetensors")):
            if path.name.startswith("."):
                continue
            count += 1
            try:
                self.read_entry(str(path.relative_to(self.root)))
            except BankError as exc:
                problems.append(exc.message)
        return count, problems


def _suggest(name: str, known: list[str], otherwise: str) -> str:
    close = difflib.get_close_matches(name, known, n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    if known:
        return f"known: {', '.join(known[:10])}{' ...' if len(known) > 10 else ''}; {otherwise}"
    return otherwise
