"""Writing a build's outputs: ONNX towers, the native checkpoint, report, lock, model card.

All of it goes into a staging folder that `build` renames into place only after every
check passed."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import numpy as np
import torch

from targets.base import OnnxTower

from . import __version__
from .errors import OutputError

ONNX_OPSET = 18


def export_onnx(tower: OnnxTower, path: Path) -> None:
    """torch.export-based ONNX export (torch's default), one file, dynamic axes as named."""
    dims: dict[str, torch.export.Dim] = {}
    dynamic_shapes = {
        name: {axis: dims.setdefault(label, torch.export.Dim(label)) for axis, label in axes.items()}
        for name, axes in tower.dynamic_axes.items()
    }
    dynamic_shapes = {name: dynamic_shapes.get(name) for name in tower.example_inputs}
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(tower.module, tuple(tower.example_inputs.values()), str(path),
                              input_names=list(tower.example_inputs), output_names=[tower.output_name],
                              dynamic_shapes=dynamic_shapes, dynamo=True, external_data=False,
                              opset_version=ONNX_OPSET, verbose=False)
        except Exception as exc:
            raise OutputError(f"ONNX export of {tower.name} failed: {type(exc).__name__}: {exc}".split("\n")[0],
                              "run with --debug for the exporter's traceback") from exc


def run_onnx(path: Path, inputs: dict[str, torch.Tensor]) -> tuple[np.ndarray, str]:
    """Run an exported tower with onnxruntime; return its output and the provider that ran."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=ort.get_available_providers())
    feeds = {i.name: inputs[i.name].cpu().numpy() for i in session.get_inputs()}
    return session.run(None, feeds)[0], session.get_providers()[0]


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def output_hashes(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): file_sha256(p) for p in sorted(root.rglob("*")) if p.is_file()}


def lock_record(target: dict, terms: list[dict], edit: dict, recipe_sha: str) -> dict:
    """Everything the build read, by hash; its own hash names the build."""
    record = {"tool": "ptc", "version": __version__, "torch": torch.__version__,
              "recipe_sha256": recipe_sha, "target": target, "edit": edit, "terms": terms}
    record["lock_hash"] = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()
    return record


def model_card(target_ref: str, library: str, edit: str, terms: list[dict], verify: dict, lock_hash: str, formats) -> str:
    rows = "\n".join(f"| {t['task']} | {t['source']} | {t['weight']:+g} | {t['grid_residual']:.3f} |" for t in terms)
    lin, eq = verify["linearity"], verify["equivalence"]
    figures = [f"- edited model vs its reference, torch: {eq['torch_max_abs_diff']:.2e}"]
    if lin is not None:
        figures.insert(0, f"- linearity (relative, fp64 / fp32): {lin['max_rel_diff_fp64']:.2e} / "
                          f"{lin['max_rel_diff_fp32']:.2e}")
    if eq.get("onnx_max_abs_diff") is not None:
        figures.append(f"- ONNX vs torch: {eq['onnx_max_abs_diff']:.2e}")
    if eq.get("reload_max_abs_diff") is not None:
        figures.append(f"- reloaded safetensors vs torch: {eq['reload_max_abs_diff']:.2e}")
    return f"""---
base_model: {json.dumps(target_ref)}
library_name: {library}
tags: [ptc, task-arithmetic, platonic-task-arithmetic]
---

# Edited encoder built by ptc {__version__}

Base model: `{target_ref}`. {edit}: same architecture, same inference cost as the base model.
The residual is `||S_edit - S_pre - sum w U|| / ||sum w U||` on the task's grid.

| task | source | weight | residual |
| --- | --- | --- | --- |
{rows}

## Verification
{chr(10).join(figures)}

Lock hash: `{lock_hash}` (see `ptc.lock`). Outputs: {', '.join(formats)}.

## Loading
- `model/`: the native {library} checkpoint; `ptc eval` and `ptc build` read it as the
  reference in `report.json` -> `native_ref`.
- `onnx/*.onnx`: `onnxruntime.InferenceSession("onnx/vision_model.onnx").run(None, {{"pixel_values": x}})`.
"""
