"""Embedding a task grid with a model, once: results are cached in the bank per
(model fingerprint, grid hash), so a warm rebuild runs no forward pass at all."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from ptc.compiler.bank.store import Bank, Entry, TaskRecord
from ptc.compiler.method.descriptor import class_embeddings
from ptc.compiler.tasks.grid import grid_hash
from ptc.devices import CPU, autocast, device_label, precision_of
from ptc.errors import BankError
from ptc.finite import require_finite
from ptc.progress import track
from ptc.targets.base import Batch, DualEncoder, batch_len, batch_rows
from ptc.timers import timed

RowsT = TypeVar("RowsT")


TORCH = "torch"  # the runtime of a model's own forward passes
ONNXRUNTIME = "onnxruntime"  # onnxruntime on its base export (compiler/export/onnx_embed.py)
# A forward pass of the input tower on a batch: (z, R or None), as DualEncoder.embed_for_edit.
InputForward = Callable[[Batch], tuple[torch.Tensor, torch.Tensor | None]]
# On a CPU a forward pass runs at most this many inputs, whatever --batch-size says, where one
# run of that many is work enough (BUSY_SECONDS). A ViT's matrix products are already large at a
# few images: larger runs only hold more activations, and torch eager ran them slower (ViT-B/16:
# 3.0-3.8 images/s in runs of 8 against 2.7-3.0 in one run of 32, the same embeddings to the
# bit; 2-core AMD EPYC, a hand run, not committed). onnxruntime's session runs the same size
# (compiler/export/onnx_embed.py), and `--embed-runtime auto` times both runtimes on one run.
CPU_RUN = 8
# A smaller model's run of 8 is mostly each call's fixed cost: a 48-wide test CLIP took 44 ms
# for 256 inputs in runs of 8 against 13 ms in runs of 64 (same machine, by hand). So batches
# are split only where the first batch's second run (the first warms up) took this long.
BUSY_SECONDS = 0.1


@dataclass(frozen=True)
class GridEmbeddings:
    inputs: torch.Tensor  # N x d, unnormalised probe embeddings
    class_rows: torch.Tensor  # M x d, normalised template-averaged class embeddings
    computed: bool  # False when it came from the bank's cache
    regressors: torch.Tensor | None = None  # N x p rows an edit acts through; None: the inputs
    # the device, precision and runtime of the passes that made it
    made_by: dict[str, str] | None = None
    prompts: torch.Tensor | None = None  # P x d, unnormalised, in the task's prompt order


@dataclass(frozen=True)
class ModelInfo:
    """What the bank records of a model: enough to key and describe its entries."""

    ref: str
    input_fingerprint: str
    text_fingerprint: str
    embed_dim: int
    edit_width: int
    precision: str = "fp32"
    runtime: str = TORCH  # what ran the input passes: torch, or onnxruntime on its export

    @property
    def weights_key(self) -> str:
        """Its input and text fingerprints together: what the model computes."""
        return hashlib.sha256(
            f"{self.input_fingerprint}|{self.text_fingerprint}".encode()
        ).hexdigest()[:32]

    @property
    def key(self) -> str:
        """Bank key of its embeddings and what derives from them: the weights key, with the
        precision and the runtime of its embedding passes where they are not fp32 and torch
        (each kept apart: their last bits differ)."""
        parts = [self.weights_key]
        parts += [self.precision] if self.precision != "fp32" else []
        parts += [self.runtime] if self.runtime != TORCH else []
        return "-".join(parts)


def model_info(model: DualEncoder, runtime: str = TORCH) -> ModelInfo:
    return ModelInfo(
        model.ref,
        model.input_fingerprint(),
        model.text_fingerprint(),
        model.embed_dim,
        model.edit_width,
        precision_of(model),
        runtime,
    )


def model_key(model: DualEncoder, runtime: str = TORCH) -> str:
    return model_info(model, runtime).key


_VERIFIED: set[tuple[object, ...]] = set()


def check_grid_unchanged(task: TaskRecord) -> None:
    """The probe files on disk must still be the grid the task was registered with.

    Re-reading every probe is the expensive part, so a grid verified once in this process is
    trusted again while no probe file's size or mtime changed."""
    stamp = (task.grid_hash, tuple((str(p), *_stat(p)) for p in task.probes))
    if stamp in _VERIFIED:
        return
    with timed("hash_probes"):
        current = grid_hash(task.probes, task.prompts)
    if current != task.grid_hash:
        raise BankError(
            f"task {task.name!r}: its probe files changed since it was registered "
            f"(grid {current[:12]} != registered {task.grid_hash[:12]})",
            "re-register with `ptc task add --replace` and recompute its descriptors",
        )
    _VERIFIED.add(stamp)


def _stat(path: Path) -> tuple[int, int]:
    try:
        info = path.stat()
    except OSError:
        return (-1, -1)  # grid_hash will report the unreadable file
    return (info.st_size, info.st_mtime_ns)


def _embed_files(
    model: DualEncoder,
    paths: Sequence[Path],
    batch_size: int,
    desc: str,
    progress: bool,
    forward: Callable[[Batch], RowsT],
) -> list[RowsT]:
    chunks = [paths[i : i + batch_size] for i in range(0, len(paths), batch_size)]
    rows = []
    batches = _decoded(model, chunks)
    runs = in_runs(model, forward)
    for batch in track(batches, len(chunks), desc, "batches", progress):
        with timed("forward"), autocast(model):
            rows.append(runs(batch))
    return rows


def in_runs(model: DualEncoder, forward: Callable[[Batch], RowsT]) -> Callable[[Batch], RowsT]:
    """`forward` as every pass runs it: on a CPU in runs of CPU_RUN inputs where a run takes
    BUSY_SECONDS (timed on the first batch's second run, the first being a warm-up), else and
    elsewhere each batch whole."""
    split: bool | None = None if model.device.type == "cpu" else False

    def run(batch: Batch) -> RowsT:
        nonlocal split
        size = batch_len(batch)
        if split is False or size <= CPU_RUN:
            return forward(batch)
        parts, first = [], 0
        if split is None and size > 2 * CPU_RUN:  # decided by the first batch's second run
            parts.append(forward(batch_rows(batch, slice(0, CPU_RUN))))  # the first: warm-up
            start = time.perf_counter()
            parts.append(forward(batch_rows(batch, slice(CPU_RUN, 2 * CPU_RUN))))
            split = time.perf_counter() - start >= BUSY_SECONDS
            first = 2 * CPU_RUN
        step = CPU_RUN if split else size
        parts.extend(
            forward(batch_rows(batch, slice(i, i + step))) for i in range(first, size, step)
        )
        return _joined(parts)

    return run


def _joined(parts: list[Any]) -> Any:
    """The rows of consecutive runs as one batch's: a tensor, or (z, R or None)."""
    if isinstance(parts[0], torch.Tensor):
        return torch.cat(parts)
    regressors = [r for _, r in parts]
    z = torch.cat([z for z, _ in parts])
    return z, None if regressors[0] is None else torch.cat(regressors)


def _decoded(model: DualEncoder, chunks: list[Sequence[Path]]) -> Iterator[Batch]:
    """Each chunk's batch. On a GPU the next one is decoded on a worker thread while the GPU
    runs this one (decoding and resizing release the GIL). On a CPU the forward pass already
    keeps every core busy, and a third thread slowed it more than decoding costs (measured at
    ViT-B/16 on 2 cores: 121 s against 105 s decoding in turn), so there it decodes in turn."""
    if model.device.type == "cpu":
        yield from (_decode(model, chunk) for chunk in chunks)
        return
    if not chunks:
        return
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="ptc-decode") as pool:
        pending = pool.submit(_decode, model, chunks[0])
        for following in [*chunks[1:], None]:
            batch = pending.result()
            if following is not None:
                pending = pool.submit(_decode, model, following)
            yield batch


def _decode(model: DualEncoder, chunk: Sequence[Path]) -> Batch:
    with timed("decode_inputs"):
        return model.load_inputs(list(chunk))


def embed_probe_files(
    model: DualEncoder, paths: Sequence[Path], batch_size: int, desc: str, progress: bool = True
) -> torch.Tensor:
    return torch.cat(_embed_files(model, paths, batch_size, desc, progress, model.embed_inputs))


def embed_probe_files_for_edit(
    model: DualEncoder,
    paths: Sequence[Path],
    batch_size: int,
    desc: str,
    progress: bool = True,
    forward: InputForward | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(z, R or None) of probe files: the embeddings and the rows an edit acts through."""
    pairs = _embed_files(model, paths, batch_size, desc, progress, forward or model.embed_for_edit)
    inputs = torch.cat([z for z, _ in pairs])
    regressors = [r for _, r in pairs if r is not None]
    return inputs, torch.cat(regressors) if len(regressors) == len(pairs) else None


def grid_forward(
    model: DualEncoder,
    task: TaskRecord,
    batch_size: int = 64,
    progress: bool = True,
    forward: InputForward | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The forward passes of one (model, grid) pair: raw input and prompt embeddings and,
    where the family's edit acts through other rows than z, those regressor rows. `forward`
    runs the input passes where another runtime than the model's own does (prompts are few and
    stay on torch)."""
    check_grid_unchanged(task)
    inputs, regressors = embed_probe_files_for_edit(
        model, list(task.probes), batch_size, f"embed {task.name}", progress, forward
    )
    with timed("forward"), autocast(model):
        prompts = model.embed_prompts(task.prompts)
    return inputs, prompts, regressors


def embedding_record(
    info: ModelInfo,
    task: TaskRecord,
    inputs: torch.Tensor,
    prompts: torch.Tensor,
    regressors: torch.Tensor | None = None,
    device: torch.device = CPU,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, meta) of a bank embeddings entry; one definition for every executor."""
    tensors = {"inputs": inputs, "prompts": prompts}
    if regressors is not None:
        tensors["regressors"] = regressors
    require_finite(
        tensors,
        f"embeddings of {info.ref} on task {task.name!r} ({info.precision})",
        "nothing was stored; its weights are finite, so the forward pass overflows "
        + (
            "its precision: try --precision fp32"
            if info.precision != "fp32"
            else "float32 on these probes: the weights hold extreme values"
        ),
    )
    return (
        tensors,
        {
            "kind": "embeddings",
            "model_ref": info.ref,
            "task": task.name,
            "grid_hash": task.grid_hash,
            "input_fingerprint": info.input_fingerprint,
            "text_fingerprint": info.text_fingerprint,
            "precision": info.precision,
            "device": device_label(device),
            "runtime": info.runtime,
        },
    )


def grid_embeddings(entry: Entry, task: TaskRecord, computed: bool) -> GridEmbeddings:
    inputs, prompts = entry.tensors["inputs"], entry.tensors["prompts"]
    regressors = entry.tensors.get("regressors")
    if (
        inputs.shape[0] != len(task.probes)
        or prompts.shape[0] != len(task.prompts)
        or (regressors is not None and regressors.shape[0] != inputs.shape[0])
    ):
        raise BankError(
            f"cached embeddings {entry.path} do not match task {task.name!r}'s grid",
            "delete the entry and rebuild",
        )
    made_by = {
        "device": entry.meta.get("device", "unrecorded"),
        "precision": entry.meta.get("precision", "fp32"),
        "runtime": entry.meta.get("runtime", TORCH),
    }
    return GridEmbeddings(
        inputs,
        class_embeddings(prompts.double(), len(task.classes)),
        computed,
        regressors,
        made_by,
        prompts,
    )


def embed_grid(
    model: DualEncoder,
    task: TaskRecord,
    bank: Bank,
    batch_size: int = 64,
    progress: bool = True,
    runtime: tuple[str, Callable[[], InputForward]] | None = None,
) -> GridEmbeddings:
    """A grid's embeddings from the bank, computed on a miss. `runtime` is (its name, what makes
    its input forward pass), made only on a miss (it may export the model first)."""
    info = model_info(model, runtime[0] if runtime else TORCH)

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        forward = runtime[1]() if runtime else None
        passes = grid_forward(model, task, batch_size, progress, forward)
        return embedding_record(info, task, *passes, device=model.device)

    entry, computed = bank.get_or_compute(bank.embeddings_rel(info.key, task.grid_hash), compute)
    return grid_embeddings(entry, task, computed)


def check_reference(
    bank: Bank, model: DualEncoder, key: str, batch: Batch
) -> tuple[tuple[torch.Tensor, torch.Tensor | None], bool]:
    """The model's torch fp32 (z, R) of a build's check batch, and whether it was computed here
    (else read from the bank). It is what the folded edit is verified against where the grids
    ran on another runtime (onnxruntime's last bits are not torch's); stored once, it spares
    each later build of the same target and check inputs this pass. `key` names the inputs
    (stages.check_set)."""
    if model.device.type != "cpu":
        raise RuntimeError(f"the check reference is a CPU pass; the model is on {model.device}")
    info = model_info(model)

    def compute() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        with timed("forward"), torch.inference_mode():
            inputs, regressors = model.embed_for_edit(batch)
        tensors = {"inputs": inputs}
        if regressors is not None:
            tensors["regressors"] = regressors
        meta = {
            "kind": "check_reference",
            "model_ref": info.ref,
            "input_fingerprint": info.input_fingerprint,
            "check": key,
            "inputs": batch_len(batch),
            "precision": "fp32",
            "device": "cpu",
            "runtime": TORCH,
        }
        return tensors, meta

    # The key names each input (its grid's hash and place), and the entry is sealed to its key:
    # a stored reference is of this very batch.
    entry, computed = bank.get_or_compute(bank.check_rel(info.weights_key, key), compute)
    return (entry.tensors["inputs"], entry.tensors.get("regressors")), computed
