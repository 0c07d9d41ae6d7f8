"""ONNX towers at the cost of what an edit changed.

Exporting a real-size tower takes tens of seconds (the tracer and the exporter walk the
whole graph) while a closed-form edit changes one or two tensors of it. So each base tower is
exported once per model and exporter version into the bank (`exports/<key>/<tower>.onnx`,
sealed with its files' hashes), and a build writes an edited tower by copying those files and
writing the changed tensors' bytes over theirs (`write_tower`): an unchanged tower (the text
tower of an image edit) is the cached graph as it is. A tensor whose bytes cannot be found
exactly once falls back to a fresh export of the edited tower. Either way the build then
checks the written graph against torch.

Every tower is written as its graph and, beside it, one external data file holding its
tensors (`<tower>.onnx.data`): a graph over protobuf's 2 GiB message limit (ViT-H/14, bigG)
can only be written so, and writing a single-file graph builds the whole message and its
serialized copy in memory, several times the tower's size at the peak.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from itertools import chain
from pathlib import Path
from typing import Any

import torch

from ptc import __version__
from ptc.compiler.bank.exports import holding_export, mark_used
from ptc.compiler.bank.store import Bank
from ptc.compiler.export.onnx_graph import ONNX_OPSET, export_onnx, onnx_files, set_metadata
from ptc.devices import page_out_weights
from ptc.errors import BankError
from ptc.targets.base import OnnxTower


def export_key(model_key: str, tower: OnnxTower) -> str:
    """What an exported graph depends on: the model (both fingerprints), the tower and its
    example input shapes, and the versions of everything that writes the graph."""
    import onnx
    import onnxscript

    shapes = sorted(
        (name, tuple(t.shape), str(t.dtype)) for name, t in tower.example_inputs.items()
    )
    text = "|".join(
        map(
            str,
            (
                model_key,
                tower.name,
                shapes,
                __version__,
                torch.__version__,
                onnx.__version__,
                onnxscript.__version__,
                ONNX_OPSET,
            ),
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_base(
    bank: Bank, key: str, tower: OnnxTower, idle: Sequence[torch.nn.Module] = ()
) -> Path:
    """The base tower's graph in the bank, exported (stack traces stripped) on first use and
    sealed with its files' hashes, which every use checks. Concurrent builds export it once:
    the second waits on the lock and finds it written. `idle`: the model's other towers, paged
    out while the exporter holds this one's graph beside the model (ptc/devices.py)."""
    bank.prepare_export(key)
    with holding_export(bank, key, (tower.name,)):
        return _cached_base_held(bank, key, tower, idle)


def cache_base(
    bank: Bank, model_key: str, tower: OnnxTower, idle: Sequence[torch.nn.Module] = ()
) -> None:
    """The tower's base export made in the bank where it is not there yet: the one-time cost,
    which a build times apart from writing its edited graph (`write_tower` then copies it). A
    bank that cannot be written caches nothing, and `write_tower` exports afresh."""
    try:
        cached_base(bank, export_key(model_key, tower), tower, idle)
    except PermissionError:
        pass


def _cached_base_held(
    bank: Bank, key: str, tower: OnnxTower, idle: Sequence[torch.nn.Module] = ()
) -> Path:
    """`cached_base`, with the export's lock held by the caller (a prune waits on it)."""
    path = bank.export_folder(key) / f"{tower.name}.onnx"
    if not _intact(bank, key, tower.name):
        for module in idle:
            page_out_weights(module)
        bank.scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(
            dir=bank.scratch, prefix=f".export-{key}.{os.getpid()}."
        ) as folder:
            written = Path(folder) / path.name
            export_onnx(tower, written)
            path.parent.mkdir(parents=True, exist_ok=True)
            for file in reversed(onnx_files(written)):
                os.replace(file, path.parent / file.name)
        # the record last: its presence means complete
        bank.seal_export(key, tower.name, onnx_files(path))
    mark_used(bank, key, tower.name)
    return path


def _intact(bank: Bank, key: str, tower: str) -> bool:
    """True for a complete, intact export; False for none (or one a crash left unsealed); a
    sealed export that no longer matches its record is a BankError, as any damaged entry."""
    problem = bank.export_problem(key, tower)
    if problem is None:
        return True
    if (bank.export_folder(key) / f"{tower}.json").exists():
        raise BankError(
            problem,
            f"delete {bank.export_folder(key)} (the next build exports it again), "
            f"or run `ptc bank verify --bank {bank.root}`",
        )
    return False


def changed_tensors(
    base: torch.nn.Module, edited: torch.nn.Module
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (base tensor, edited tensor)} of the tensors the edit replaced. An edit shares every
    tensor it did not change with its base (targets.base.copy_sharing), so identity says which."""

    def named(module: torch.nn.Module) -> dict[str, torch.Tensor]:
        return dict(
            chain(
                module.named_parameters(remove_duplicate=False),
                module.named_buffers(remove_duplicate=False),
            )
        )

    before = named(base)
    return {
        name: (before[name], tensor)
        for name, tensor in named(edited).items()
        if name not in before or tensor is not before[name]
    }


def find_patches(
    files: list[Path], changed: dict[str, tuple[torch.Tensor, torch.Tensor]]
) -> list | None:
    """Where the cached graph's files hold each changed tensor, and the bytes to write there:
    [(file, offset, bytes)]. A tensor is found by its stored bytes, as they are or transposed
    (the exporter stores some weights pre-transposed: SigLIP's head MLP), in one place, or in
    none (then this tower does not use it: the image projection, in the text tower's graph).
    None where a match would be a guess: values so uniform that they could be any tensor's, or
    found in more than one place."""
    wanted: list[
        list[tuple[bytes, bytes]]
    ] = []  # per tensor: (old, new) bytes, as is or transposed
    for before, after in changed.values():
        old, new = before.detach().cpu().contiguous(), after.detach().cpu().contiguous()
        if torch.equal(old, new):
            continue  # a tensor the edit rewrote with the same values (a zero bias)
        if old.numel() <= 1 or old.dtype != new.dtype or bool((old == old.reshape(-1)[0]).all()):
            return None
        pairs = [(old, new)] + ([(old.T, new.T)] if old.ndim == 2 else [])
        wanted.append([(_raw(a), _raw(b)) for a, b in pairs])
    needles = [old for forms in wanted for old, _ in forms]
    found = {file: _offsets(file, needles) for file in files} if needles else {}
    patches = []
    for forms in wanted:
        hits = [
            (file, offset, new)
            for old, new in forms
            for file in files
            for offset in found[file][old]
        ]
        if len(hits) > 1:
            return None
        patches += hits
    return patches


def _raw(tensor: torch.Tensor) -> bytes:
    """A tensor's bytes as ONNX stores them: row-major, little-endian (this host's order)."""
    return tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _offsets(path: Path, needles: list[bytes], chunk: int = 64 << 20) -> dict[bytes, list[int]]:
    """Every offset of each needle in the file, read in chunks (a graph can be gigabytes)."""
    offsets: dict[bytes, list[int]] = {needle: [] for needle in needles}
    keep = max(len(n) for n in needles) - 1  # a match across two chunks is found in the next
    with open(path, "rb") as handle:
        tail, position = b"", 0
        while block := handle.read(chunk):
            data, base = tail + block, position - len(tail)
            for needle in needles:
                start = data.find(needle)
                while start != -1:
                    if base + start not in offsets[needle]:
                        offsets[needle].append(base + start)
                    start = data.find(needle, start + 1)
            tail, position = data[-keep:] if keep else b"", position + len(block)
    return offsets


def write_tower(
    bank: Bank,
    model_key: str,
    base: OnnxTower,
    edited: OnnxTower,
    path: Path,
    provenance: dict[str, Any],
    idle: Sequence[torch.nn.Module] = (),
) -> str:
    """The edited tower's graph at `path`, with provenance in its metadata, written once; returns
    how: "reused" (nothing changed), "patched" (changed bytes replaced) or "exported" (fresh).
    `idle` as for `cached_base`.

    A patched graph is the cached one copied (a kernel copy), the changed tensors' bytes written
    over theirs in place (same dtype and shape, so the same length), and the provenance appended
    as a second serialized ModelProto holding only metadata_props: protobuf merges concatenated
    messages, so every reader sees one model. Nothing is parsed or re-serialized."""
    key = export_key(model_key, base)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        bank.prepare_export(key)
        with holding_export(bank, key, (base.name,)):  # no prune while it is copied from
            cached = _cached_base_held(bank, key, base, idle)
            patches = find_patches(onnx_files(cached), changed_tensors(base.module, edited.module))
            if patches is not None:
                _copy_patched(cached, path, patches)
    except PermissionError:  # a bank shared read-only: no cache, every build exports afresh
        patches = None
    if patches is None:
        _export_fresh(edited, path, provenance)
        return "exported"
    with open(path, "ab") as handle:
        handle.write(_metadata_message(provenance))
    return "patched" if patches else "reused"


def _copy_patched(cached: Path, path: Path, patches: list) -> None:
    """The cached graph's files copied beside `path`, the patches' bytes written over theirs.
    The graph is renamed as asked; its data file keeps the name the graph records for it."""
    copies = {
        file: path if file == cached else path.with_name(file.name) for file in onnx_files(cached)
    }
    for source, target in copies.items():
        shutil.copyfile(source, target)
    for file, offset, data in patches:
        with open(copies[file], "r+b") as handle:
            handle.seek(offset)
            handle.write(data)


def _metadata_message(provenance: dict[str, Any]) -> bytes:
    import onnx

    message = onnx.ModelProto()
    set_metadata(message, provenance)
    return message.SerializeToString()


def _export_fresh(tower: OnnxTower, path: Path, provenance: dict[str, Any]) -> None:
    export_onnx(tower, path)
    with open(path, "ab") as handle:
        handle.write(_metadata_message(provenance))
