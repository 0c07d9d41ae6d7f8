"""Writing the serving contract beside the graphs (`onnx/serving.json`, `onnx/tokenizer.json`)
and measuring it against the family's own preprocessing and tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ptc.compiler.serve.contract import (
    CONTRACT_FILE,
    TOKENIZER_FILE,
    contract_bytes,
    contract_document,
)
from ptc.files import write_bytes_atomic
from ptc.targets.base import Batch, OnnxTower
from ptc.targets.serving import ServingSpec

# Normalisation in another order differs by float32 rounding (a few 1e-7).
FLOAT_ROUNDING = 1e-6
# A prompt past every family's context: the contract must truncate it as the family does.
LONG_PROMPT = " ".join(["a photo of a small red square on a blue background"] * 12)


def write_contract(spec: ServingSpec, towers: list[OnnxTower], folder: Path) -> list[str]:
    """The contract and tokenizer for `towers` (input tower first, text tower last) in
    `folder`; returns the files written, relative to the output."""
    first, text = towers[0], towers[-1]
    contract = contract_document(
        {
            "graph": f"{first.name}.onnx",
            "output": first.output_name,
            "preprocessing": spec.preprocessing,
        },
        {
            "graph": f"{text.name}.onnx",
            "output": text.output_name,
            "inputs": list(spec.text_inputs),
            "tokenizer": TOKENIZER_FILE,
            "context_length": spec.context_length,
            "padding": spec.padding,
            "padding_side": spec.padding_side,
            "truncation_side": spec.truncation_side,
            "pad_id": spec.pad_id,
        },
    )
    write_bytes_atomic(folder / TOKENIZER_FILE, spec.tokenizer_json.encode("utf-8"))
    write_bytes_atomic(folder / CONTRACT_FILE, contract_bytes(contract))
    return [f"onnx/{CONTRACT_FILE}", f"onnx/{TOKENIZER_FILE}"]


# Resizing with PIL where the family's processor uses torchvision moves a few pixels by one
# intensity level, and under 0.1% of them by two (measured on every image family in
# tests/test_serving.py); an image already at the model's size is not resized at all.
RESIZE_LEVELS = 2


def preprocess_tolerance(preprocessing: dict[str, Any], atol: float) -> float:
    """How far the contract's inputs may sit from the family's: RESIZE_LEVELS intensity levels
    for images, the build's tolerance for audio (the same arithmetic in numpy)."""
    if preprocessing["kind"] == "audio":
        return atol
    level = float(preprocessing["rescale"]) / min(preprocessing["std"])
    return RESIZE_LEVELS * level + atol


def preprocess_difference(arrays: dict[str, np.ndarray], batch: Batch) -> tuple[float, int]:
    """(largest difference between the client's inputs and the family's, rows that agree to
    float rounding: the graph's verified output holds for those as it is)."""
    largest, identical = 0.0, np.ones(len(next(iter(batch.values()))), dtype=bool)
    for name, tensor in batch.items():
        expected = tensor.cpu().numpy()
        got = arrays.get(name)
        if got is None or got.shape != expected.shape:
            return float("inf"), 0
        gap = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        largest = max(largest, float(gap.max(initial=0.0)))
        identical &= gap.reshape(len(gap), -1).max(axis=1, initial=0.0) <= FLOAT_ROUNDING
    return largest, int(identical.sum())


def token_agreement(arrays: dict[str, np.ndarray], tokens: Batch) -> np.ndarray:
    """Which prompts the contract's tokenizer turns into exactly the family's text-graph inputs
    (ids and, where the graph takes one, the mask): one bool per prompt, False for every prompt
    where the two disagree on a padded length."""
    rows = len(next(iter(tokens.values())))
    same = np.ones(rows, dtype=bool)
    for name, array in arrays.items():
        expected = tokens[name].cpu().numpy() if name in tokens else None
        if expected is None or array.shape != expected.shape:
            return np.zeros(rows, dtype=bool)
        same &= (array == expected).all(axis=1)
    return same
