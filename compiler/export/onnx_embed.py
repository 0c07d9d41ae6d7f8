"""Embedding passes on onnxruntime, over the model's base export cached in the bank.

The embed stage is most of a cold build, and on a CPU onnxruntime runs the same fp32 graph
faster than torch eager, by how much depending on the CPU (ViT-B/16 on 2 cores: 1.11x on an
AMD EPYC without AVX-512, 2.2x on one with it; the same embeddings to 2e-6). A build that
writes ONNX exports the base towers anyway, so exporting them first costs it nothing. It applies where the edit acts on the embeddings themselves (an (I + A)
fold: R = z, the graph's output); a family whose edit acts through other rows (SigLIP's head)
needs its own forward pass. Prompts are few and stay on torch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ptc.compiler.bank.store import Bank
from ptc.compiler.embed import CPU_RUN, ONNXRUNTIME, TORCH, InputForward, model_info
from ptc.compiler.export.tower_cache import cached_base, export_key
from ptc.devices import page_out_weights, precision_of
from ptc.errors import InputError
from ptc.memory import give_back_freed_memory
from ptc.targets.base import Batch, Family


def unavailable(model: Family) -> str | None:
    """Why the model's embedding passes cannot run on onnxruntime; None when they can."""
    if model.device.type != "cpu":
        return f"its passes run on {model.device} (onnxruntime is chosen on a CPU only)"
    if precision_of(model) != "fp32":
        return f"its passes run in {precision_of(model)} (onnxruntime runs the fp32 graph)"
    if not model.edit_acts_on_embeddings:
        return "its edit acts through rows inside the input tower, which its graph does not output"
    return None


def choose_runtime(model: Family, bank: Bank, asked: str, export_due: bool) -> str:
    """The runtime of the model's embedding passes, before any timing. `auto`: onnxruntime
    where it can run and the base export is about to be written anyway (`export_due`: the build
    writes ONNX) or is cached; else torch, so that a one-off pass never pays for an export it
    does not need. A build that writes ONNX, and so a lock, thus gets the same runtime whatever
    its bank already holds, save where onnxruntime then measures slower than torch on this
    machine (compiler/export/runtime_speed.py, recorded once per model and machine)."""
    if asked == TORCH:
        return TORCH
    reason = unavailable(model)
    if reason is not None:
        if asked == ONNXRUNTIME:
            raise InputError(
                f"--embed-runtime onnxruntime: not for {model.ref}: {reason}",
                "use --embed-runtime auto (it picks torch there) or torch",
            )
        return TORCH
    if asked == ONNXRUNTIME or export_due or _export_cached(model, bank):
        return ONNXRUNTIME
    return TORCH


def _export_cached(model: Family, bank: Bank) -> bool:
    tower = model.onnx_towers()[0]
    key = export_key(model_info(model).weights_key, tower)
    return (bank.export_folder(key) / f"{tower.name}.json").is_file()


class OnnxInputPass:
    """The onnxruntime pass of a model's input tower: its base export written into the bank
    (once) and opened in one session when first called, for as long as embedding goes on;
    `close` lets the session (a second copy of the tower's weights) go before the export."""

    def __init__(self, model: Family, bank: Bank) -> None:
        self.model, self.bank = model, bank
        self._forward: InputForward | None = None

    def export(self) -> Path:
        """The base export's graph in the bank, exported on first use."""
        tower, *others = self.model.onnx_towers()
        key = export_key(model_info(self.model).weights_key, tower)
        return cached_base(self.bank, key, tower, idle=[other.module for other in others])

    def __call__(self) -> InputForward:
        if self._forward is None:
            self.page_out_torch_tower()  # before the session loads and prepacks its own copy
            self._forward = session_forward(self.export())
        return self._forward

    def page_out_torch_tower(self) -> None:
        """While the session embeds, torch's copy of the tower is idle: where it maps the
        checkpoint (transformers' loader) it leaves resident memory until torch runs it again.
        On ViT-B/16 that copy is the size of the session's."""
        page_out_weights(self.model.onnx_towers()[0].module)

    def close(self) -> None:
        self._forward = None
        give_back_freed_memory()


def input_forward(model: Family, bank: Bank) -> OnnxInputPass:
    return OnnxInputPass(model, bank)


# Images per session run. The session's activations grow with its batch while its speed does
# not (a ViT's matrix products are already large at a few images): over ViT-B/16's 329 MB graph,
# runs of 8 held 603 MB at their peak against 1,234 MB for runs of 64, at 1.04x and 1.14x
# their images/s in two rounds (benchmarks/session_batch.py, 2 cores).
SESSION_BATCH = CPU_RUN  # the runs a real-size model's CPU passes take (compiler/embed.py)


def session_forward(path: Path) -> InputForward:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # The arena keeps every batch's activations allocated: `ptc bench --size vit-b16`'s cold build
    # peaked at 3.9 GB with it and 2.9 GB without, at the same images/s (2 cores).
    options.enable_cpu_mem_arena = False
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]

    def forward(batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        size = len(batch[names[0]])
        runs = [
            session.run(
                None, {name: batch[name][i : i + SESSION_BATCH].cpu().numpy() for name in names}
            )[0]
            for i in range(0, size, SESSION_BATCH)
        ]
        return torch.from_numpy(np.concatenate(runs)), None

    return forward
