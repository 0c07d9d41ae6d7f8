"""Writing a build's outputs: ONNX towers, the native checkpoint, report, lock, model card.

All of it goes into a staging folder that `build` renames into place only after every
check passed."""

from __future__ import annotations

import json
import os
import shutil
import struct
import warnings
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ptc.targets.base import Exportable, OnnxTower

from ptc import __version__
from ptc.errors import OutputError
from ptc.finite import require_finite
from ptc.files import atomic_file, safetensors_header
from ptc.compiler.export.card_plot import PLOT_NAME
from ptc.compiler.export.tower_cache import copy_onnx, save_onnx

ONNX_OPSET = 18


@contextmanager
def _without_input_asserts():
    """transformers guards inputs with torch._check asserts (SigLIP2's spatial shapes) that
    trace into aten._is_all_true, which has no ONNX translation. They validate inputs and
    compute nothing, so the export leaves them out (transformers' own switch); the graph is
    checked against torch numerically right after."""
    previous = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK")
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = previous


@contextmanager
def _quiet_exporter():
    """The exporter's optimizer logs a warning per op it leaves unfolded ("Skipping constant
    folding for op Split ..."): notes for its developers, not for someone building a model.
    Errors still show; --debug shows the exporter's traceback."""
    import logging

    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def export_onnx(tower: OnnxTower, path: Path) -> None:
    """torch.export-based ONNX export (torch's default), dynamic axes as named, written once:
    stack traces dropped in memory, the tensors as external data beside the graph."""
    dims: dict[str, torch.export.Dim] = {}
    dynamic_shapes = {
        name: {axis: dims.setdefault(label, torch.export.Dim(label)) for axis, label in axes.items()}
        for name, axes in tower.dynamic_axes.items()
    }
    dynamic_shapes = {name: dynamic_shapes.get(name) for name in tower.example_inputs}
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(), torch.inference_mode(False), torch.no_grad(), _without_input_asserts(), \
            _quiet_exporter():
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(tower.module, tuple(tower.example_inputs.values()), None,
                                        input_names=list(tower.example_inputs), output_names=[tower.output_name],
                                        dynamic_shapes=dynamic_shapes, dynamo=True, opset_version=ONNX_OPSET,
                                        verbose=False)
        except Exception as exc:
            raise OutputError(f"ONNX export of {tower.name} failed: {type(exc).__name__}: {exc}".split("\n")[0],
                              "run with --debug for the exporter's traceback") from exc
    _drop_stack_traces(program.model)
    program.save(str(path), external_data=True)  # tensors beside the graph: see towers.py


def run_onnx(path: Path, inputs: dict[str, torch.Tensor]) -> tuple[np.ndarray, dict]:
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
    require_finite({session.get_outputs()[0].name: torch.from_numpy(output)}, f"ONNX graph {path} on the check inputs",
                   "nothing was written; the exported graph computes another function than the model")
    return output, {"requested": requested[0], "ran": ran, "fell_back": ran != requested[0]}


def set_metadata(model, provenance: dict[str, str]) -> None:
    """Provenance in the graph's metadata_props (what `onnx.load(...).metadata_props` shows)."""
    existing = {p.key: p for p in model.metadata_props}
    for key, value in provenance.items():
        entry = existing.get(key) or model.metadata_props.add()
        entry.key, entry.value = key, str(value)


def _drop_stack_traces(model) -> None:
    """The exporter records each node's Python stack trace, with the absolute paths of the
    files that traced it: the same model exported from another checkout or virtualenv would
    differ in bytes. The trace is a debugging aid, not part of the graph (an onnx_ir model)."""
    nodes = [*model.graph.all_nodes(), *(node for function in model.functions.values() for node in function)]
    for node in nodes:
        node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)


def fp16_variant(source: Path, target: Path, provenance: dict[str, str]) -> None:
    """Weights and activations in float16, inputs and outputs kept float32 (same feeds)."""
    import onnx
    from onnxconverter_common import float16

    with warnings.catch_warnings():  # "-3.4e38 truncated to -1e4": attention masks, harmless
        warnings.simplefilter("ignore")
        model = float16.convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    _retarget_float_casts(model)
    set_metadata(model, {**provenance, "ptc_precision": "fp16"})
    save_onnx(model, target)


def _retarget_float_casts(model) -> None:
    """The converter re-types a Cast-to-float's output as float16 but leaves the node's `to`
    at float (onnxconverter-common issue 320), which onnxruntime rejects at load. Such casts
    come from integer inputs (SigLIP2's patch grid): point them at float16 as declared."""
    from onnx import TensorProto

    declared = {info.name: info.type.tensor_type.elem_type for info in model.graph.value_info}
    for node in model.graph.node:
        if node.op_type != "Cast" or declared.get(node.output[0]) != TensorProto.FLOAT16:
            continue
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.FLOAT16


def min_row_cosine(a, b) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).min())


def stamp_safetensors(folder: Path, provenance: dict[str, str]) -> None:
    """Add provenance to the `__metadata__` of every safetensors file under `folder`, keeping
    what the library wrote there (transformers needs `format: pt`), the header in sorted order
    (safetensors writes its metadata map in hash order, which changes from process to process,
    and the same build must give the same bytes). Data offsets are relative to the end of the
    header, so only the header is rewritten: the tensor bytes are streamed across, never loaded."""
    for path in sorted(folder.rglob("*.safetensors")):
        with open(path, "rb") as source:
            try:
                header = safetensors_header(source, path.stat().st_size)
            except ValueError as exc:
                raise OutputError(f"{path}: not a safetensors file: {exc}") from None
            metadata = dict(header.get("__metadata__") or {})
            metadata.update({"format": metadata.get("format", "pt"), **{k: str(v) for k, v in provenance.items()}})
            header["__metadata__"] = metadata
            encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
            encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
            with atomic_file(path) as target:
                target.write(struct.pack("<Q", len(encoded)) + encoded)
                shutil.copyfileobj(source, target, 16 << 20)


def _interface_table(interfaces: dict) -> str:
    """Each graph's inputs and outputs as a deployer needs them. A text graph whose sequence axis
    is a number takes prompts padded to exactly that many tokens (padding="max_length"); one
    whose axis is named takes any length, padded to the longest in the batch."""
    rows = [f"| `{graph}` | {kind} | `{v['name']}` | {v['dtype']} | "
            f"[{', '.join(str(d) for d in v['shape'])}] |"
            for graph, spec in interfaces.items() for kind in ("inputs", "outputs")
            for v in spec[kind]]
    if not rows:
        return ""
    return ("\n| graph | | name | dtype | shape (named axes are dynamic) |\n| --- | --- | --- | --- | --- |\n"
            + "\n".join(rows) + "\n\nA text graph with a fixed sequence length takes prompts padded to exactly "
            "that many tokens (`padding=\"max_length\"`); a named one takes the longest prompt's length.")


TRITON_TYPES = {1: "TYPE_FP32", 10: "TYPE_FP16", 7: "TYPE_INT64", 6: "TYPE_INT32", 9: "TYPE_BOOL"}


def _triton_tensors(values) -> str:
    blocks = []
    for value in values:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim][1:]  # batch is implicit
        blocks.append(f'  {{\n    name: "{value.name}"\n    data_type: {TRITON_TYPES[tensor.elem_type]}\n'
                      f'    dims: [ {", ".join(map(str, dims))} ]\n  }}')
    return ",\n".join(blocks)


def write_triton_model(repository: Path, name: str, onnx_path: Path, max_batch_size: int) -> Path:
    """`<repository>/<name>/config.pbtxt` and `<name>/1/model.onnx`, read off the ONNX graph
    itself so that names, types and dims cannot drift from it."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    folder = repository / name
    copy_onnx(onnx_path, folder / "1", "model.onnx")
    config = (f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
              f"input [\n{_triton_tensors(graph.input)}\n]\noutput [\n{_triton_tensors(graph.output)}\n]\n"
              "dynamic_batching { }\n")
    (folder / "config.pbtxt").write_text(config)
    return folder


def model_card(encoder: Exportable, target_ref: str, edit: str, terms: list[dict], report: dict) -> str:
    """The output's README.md: a Hugging Face model card (huggingface_hub's ModelCard), whose
    `base_model` is the Hub id the target came from (none for a local folder) and whose
    model-index holds the held-out evaluation."""
    verify, lock_hash = report["verify"], report["lock_hash"]
    rows = "\n".join(f"| {t['task']} | {t['source']} | {t['weight']:+g} | {t['grid_residual']:.3f} |" for t in terms)
    lin, eq = verify["linearity"], verify["equivalence"]
    figures = [f"- edited model vs its reference, torch: {eq['torch_max_abs_diff']:.2e}"]
    if lin is not None:
        figures.insert(0, f"- linearity (relative, fp64 / fp32): {lin['max_rel_diff_fp64']:.2e} / "
                          f"{lin['max_rel_diff_fp32']:.2e}")
    if eq.get("onnx_max_abs_diff") is not None:
        figures.append(f"- ONNX vs torch: {eq['onnx_max_abs_diff']:.2e} (ran on {eq['onnx_provider']})")
    if eq.get("fp16_min_cosine") is not None:
        figures.append(f"- fp16 ONNX vs fp32 ONNX, lowest cosine: {eq['fp16_min_cosine']:.6f}")
    if eq.get("reload_max_abs_diff") is not None:
        figures.append(f"- reloaded safetensors vs torch: {eq['reload_max_abs_diff']:.2e}")
    tags = ["ptc", "task-arithmetic", "platonic-task-arithmetic", report["route"].replace("_", "-")]
    loading = [f"### {encoder.library}\n```python\n{encoder.load_snippet('model')}\n```"] if report["native_ref"] else []
    if report.get("onnx_files"):
        loading.append("### onnxruntime\n```python\nimport onnxruntime as ort\n"
                       f'session = ort.InferenceSession("{report["onnx_files"][0]}")  # its .onnx.data beside it\n'
                       "embeds = session.run(None, {name: array})[0]  # the inputs below\n```\n"
                       + _interface_table(report.get("onnx_interface", {})))
    if report.get("triton_models"):
        loading.append("### Triton\n```bash\ntritonserver --model-repository=triton\n"
                       f"curl localhost:8000/v2/models/{report['triton_models'][0]}/config\n"
                       "# infer: POST /v2/models/<name>/infer with the inputs of config.pbtxt\n```")
    evaluation = report.get("evaluation") or {}
    data = ModelCardData(base_model=encoder.hub_id, library_name=encoder.library,
                         pipeline_tag=encoder.pipeline_tag, tags=tags,
                         model_name=f"ptc edit of {target_ref}" if evaluation else None,
                         eval_results=_eval_results(evaluation, encoder.pipeline_tag) or None)
    pictured = f"\n## Held-out evaluation\n{_evaluation_table(evaluation)}\n\n![held-out accuracy]({PLOT_NAME})\n" \
        if evaluation else ""
    return str(ModelCard(f"""---
{data.to_yaml()}
---

# Edited encoder built by ptc {__version__}

Base model: `{target_ref}`. {edit}: same architecture, same inference cost as the base model.
The residual is `||S_edit - S_pre - sum w U|| / ||sum w U||` on the task's grid.

| task | source | strength | residual |
| --- | --- | --- | --- |
{rows}

## Verification
{chr(10).join(figures)}
{pictured}
Lock hash: `{lock_hash}` (see `ptc.lock`; the ONNX graphs and safetensors files carry it in
their metadata). Outputs: {', '.join(report['formats'])}; precision: {', '.join(report['precision'])}.

## Loading
{chr(10).join(loading)}
"""))


def _eval_results(evaluation: dict[str, dict], task_type: str) -> list[EvalResult]:
    """The card's model-index: per evaluated task, top-1 accuracy after the edit and before it."""
    return [EvalResult(task_type=task_type, dataset_type=task, dataset_name=task, dataset_split="held-out",
                       metric_type="accuracy", metric_name=f"top-1 accuracy {when} ({f['role']})",
                       metric_value=round(f[key], 6))
            for task, f in evaluation.items() for when, key in (("after the edit", "after"), ("zero-shot", "before"))]


def _evaluation_table(evaluation: dict[str, dict]) -> str:
    rows = "\n".join(f"| {task} | {f['role']} | {f['before']:.3f} | {f['after']:.3f} | {f['delta_points']:+.1f} |"
                     for task, f in evaluation.items())
    return f"| task | role | zero-shot | edited | points |\n| --- | --- | --- | --- | --- |\n{rows}"
