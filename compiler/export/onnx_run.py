"""Running an exported graph with onnxruntime, and comparing what two runs gave."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import numpy as np
import torch

from ptc.compiler.verify.checks import ArrayLike
from ptc.finite import require_finite
from ptc.memory import give_back_freed_memory


class ProviderRun(TypedDict):
    """Which onnxruntime provider a run asked for and which one ran (CUDA falls back silently)."""

    requested: str
    ran: str
    fell_back: bool


def run_onnx(path: Path, inputs: dict[str, torch.Tensor]) -> tuple[np.ndarray, ProviderRun]:
    """Run an exported tower with onnxruntime on the best provider installed; return its output
    and which provider was asked for and which one actually ran (a CUDA provider that could
    not start falls back to CPU silently, so both are reported)."""
    import onnxruntime as ort

    # Some wheels list pseudo providers (AzureExecutionProvider) first; ask for real devices.
    available = ort.get_available_providers()
    requested = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in available]
    session = ort.InferenceSession(str(path), providers=requested)
    feeds = {i.name: inputs[i.name].cpu().numpy() for i in session.get_inputs()}
    ran = session.get_providers()[0]
    output = session.run(None, feeds)[0]
    output_name = session.get_outputs()[0].name
    del session
    give_back_freed_memory()  # the session's weights, or every later stage starts above them
    require_finite(
        {output_name: torch.from_numpy(output)},
        f"ONNX graph {path} on the check inputs",
        "nothing was written; the exported graph computes another function than the model",
    )
    return output, {"requested": requested[0], "ran": ran, "fell_back": ran != requested[0]}


def min_row_cosine(a: ArrayLike, b: ArrayLike) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min())
