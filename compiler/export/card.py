"""The output's README.md: a Hugging Face model card with what was built, how it
verified, the held-out evaluation and how to load each format."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from ptc import __version__
from ptc.compiler.export.card_plot import PLOT_NAME
from ptc.compiler.recipe.plan import TermRecord
from ptc.compiler.serve.contract import Contract, describe
from ptc.compiler.verify.evaluate import HeldOut
from ptc.targets.base import Family


def _interface_table(interfaces: dict[str, Any]) -> str:
    """Each graph's inputs and outputs as a deployer needs them. A text graph whose sequence axis
    is a number takes prompts padded to exactly that many tokens (padding="max_length"); one
    whose axis is named takes any length, padded to the longest in the batch."""
    rows = [
        f"| `{graph}` | {kind} | `{v['name']}` | {v['dtype']} | "
        f"[{', '.join(str(d) for d in v['shape'])}] |"
        for graph, spec in interfaces.items()
        for kind in ("inputs", "outputs")
        for v in spec[kind]
    ]
    if not rows:
        return ""
    return (
        "\n| graph | | name | dtype | shape (named axes are dynamic) |\n| --- | --- | --- | --- | --- |\n"
        + "\n".join(rows)
        + "\n\nA text graph with a fixed sequence length takes prompts padded to exactly "
        'that many tokens (`padding="max_length"`); a named one takes the longest prompt\'s length.'
    )


def _onnx_section(serving: Contract, interfaces: dict[str, Any]) -> str:
    """The graphs without torch: the text side in four lines of tokenizers and onnxruntime, the
    input side through ptc's client of the contract, and the contract in words."""
    text = serving["text"]
    feeds = {
        "input_ids": '"input_ids": np.array([e.ids for e in encodings])',
        "attention_mask": '"attention_mask": np.array([e.attention_mask for e in encodings])',
    }
    steps = "\n".join(f"{i}. {step}" for i, step in enumerate(describe(serving), start=1))
    audio = serving["input"]["preprocessing"]["kind"] == "audio"
    example = "clip.wav" if audio else "cat.jpg"
    return (
        "### onnxruntime, without torch\n"
        "`onnx/serving.json` holds the preprocessing as data and `onnx/tokenizer.json` the tokenizer, "
        "with its truncation and padding set:\n"
        "```python\nimport numpy as np\nimport onnxruntime as ort\nfrom tokenizers import Tokenizer\n\n"
        f'tokenizer = Tokenizer.from_file("onnx/{text["tokenizer"]}")\n'
        f'text_model = ort.InferenceSession("onnx/{text["graph"]}")  # its .onnx.data beside it\n'
        'encodings = tokenizer.encode_batch(["a photo of a cat", "a photo of a dog"])\n'
        "text_embeds = text_model.run(None, {\n"
        + "".join(f"    {feeds[name]},\n" for name in text["inputs"])
        + "})[0]\n"
        "```\n"
        "ptc's client follows the whole contract with numpy, PIL and onnxruntime (it never imports "
        "torch); `ptc eval . --runtime onnx --task TASK --data FOLDER` gives the accuracy a "
        "serving host gets:\n"
        "```python\nfrom ptc.compiler.serve.client import OnnxClient\n\n"
        'client = OnnxClient("onnx")\n'
        'text_embeds = client.embed_texts(["a photo of a cat", "a photo of a dog"])\n'
        f'# input_embeds = client.embed_inputs(["{example}"])\n```\n'
        f"What a client does before the graphs see an input:\n\n{steps}\n"
        + _interface_table(interfaces)
    )


def _sizes_table(sizes: dict[str, int]) -> str:
    """Each graph's size on disk with its data file: what a precision saves."""
    if not sizes:
        return ""
    rows = "\n".join(
        f"| `{graph}` | {_precision_of(graph)} | {size / 1e6:.1f} MB |"
        for graph, size in sizes.items()
    )
    return f"\n| graph | precision | size |\n| --- | --- | --- |\n{rows}\n"


def _precision_of(graph: str) -> str:
    stem = Path(graph).stem
    return next((p for p in ("fp16", "int8") if stem.endswith(f"_{p}")), "fp32")


def base_model_name(encoder: Family) -> str:
    """The base model as whoever receives the output can find it: its Hub id where it came from
    the Hub, else its checkpoint folder's name and its fingerprints, which identify the weights
    wherever they lie (the recipe's relative path means nothing to a receiver)."""
    if encoder.hub_id:
        return encoder.hub_id
    location = encoder.ref.partition(":")[2].rpartition(":")[2].rpartition("@")[2]
    return (
        f"{Path(location).name or location} (input fingerprint "
        f"{encoder.input_fingerprint()[:16]}, text fingerprint {encoder.text_fingerprint()[:16]})"
    )


def model_card(
    encoder: Family,
    edit: str,
    terms: list[TermRecord],
    report: dict[str, Any],
    serving: Contract | None = None,
) -> str:
    """The output's README.md: a Hugging Face model card (huggingface_hub's ModelCard), whose
    `base_model` is the Hub id the target came from (none for a local folder) and whose
    model-index holds the held-out evaluation."""
    verify, lock_hash = report["verify"], report["lock_hash"]
    rows = "\n".join(
        f"| {t['task']} | {t['source']} | {t['weight']:+g} | {t['grid_residual']:.3f} |"
        for t in terms
    )
    lin, eq = verify["linearity"], verify["equivalence"]
    figures = [f"- edited model vs its reference, torch: {eq['torch_max_abs_diff']:.2e}"]
    if lin is not None:
        figures.insert(
            0,
            f"- linearity (relative, fp64 / fp32): {lin['max_rel_diff_fp64']:.2e} / "
            f"{lin['max_rel_diff_fp32']:.2e}",
        )
    if eq.get("onnx_max_abs_diff") is not None:
        figures.append(
            f"- ONNX vs torch: {eq['onnx_max_abs_diff']:.2e} (ran on {eq['onnx_provider']})"
        )
    if eq.get("fp16_min_cosine") is not None:
        figures.append(f"- fp16 ONNX vs fp32 ONNX, lowest cosine: {eq['fp16_min_cosine']:.6f}")
    if eq.get("int8_min_cosine") is not None:
        figures.append(
            f"- int8 ONNX vs fp32 ONNX, lowest cosine: {eq['int8_min_cosine']:.6f}; zero-shot "
            f"top-1 agreement on the check inputs: {eq['int8_top1_agreement']:.1%}"
        )
    if eq.get("reload_max_abs_diff") is not None:
        figures.append(f"- reloaded safetensors vs torch: {eq['reload_max_abs_diff']:.2e}")
    tags = ["ptc", "task-arithmetic", "platonic-task-arithmetic", report["route"].replace("_", "-")]
    loading = (
        [f"### {encoder.library}\n```python\n{encoder.load_snippet('model')}\n```"]
        if report["native_ref"]
        else []
    )
    if report.get("onnx_files") and serving is not None:
        loading.append(_onnx_section(serving, report.get("onnx_interface", {})))
        loading.append(_sizes_table(report.get("onnx_bytes", {})))
    if report.get("triton_models"):
        loading.append(
            "### Triton\n```bash\ntritonserver --model-repository=triton\n"
            f"curl localhost:8000/v2/models/{report['triton_models'][0]}/config\n"
            "# infer: POST /v2/models/<name>/infer with the inputs of config.pbtxt\n```"
        )
    evaluation, base = report.get("evaluation") or {}, base_model_name(encoder)
    data = ModelCardData(
        base_model=encoder.hub_id,
        library_name=encoder.library,
        pipeline_tag=encoder.pipeline_tag,
        tags=tags,
        model_name=f"ptc edit of {base}" if evaluation else None,
        eval_results=_eval_results(evaluation, encoder.pipeline_tag) or None,
    )
    pictured = (
        f"\n## Held-out evaluation\n{_evaluation_table(evaluation)}\n\n![held-out accuracy]({PLOT_NAME})\n"
        if evaluation
        else ""
    )
    return str(
        ModelCard(f"""---
{data.to_yaml()}
---

# Edited encoder built by ptc {__version__}

Base model: `{base}`. {edit}: same architecture, same inference cost as the base model.
The residual is `||S_edit - S_pre - sum w U|| / ||sum w U||` on the task's grid.

| task | source | strength | residual |
| --- | --- | --- | --- |
{rows}

## Verification
{chr(10).join(figures)}
{pictured}
Lock hash: `{lock_hash}` (see `ptc.lock`; the ONNX graphs and safetensors files carry it in
their metadata). Outputs: {", ".join(report["formats"])}; precision: {", ".join(report["precision"])}.

## Loading
{chr(10).join(loading)}
""")
    )


def _eval_results(evaluation: dict[str, HeldOut], task_type: str) -> list[EvalResult]:
    """The card's model-index: per evaluated task, top-1 accuracy after the edit and before it."""
    return [
        EvalResult(
            task_type=task_type,
            dataset_type=task,
            dataset_name=task,
            dataset_split="held-out",
            metric_type="accuracy",
            metric_name=f"top-1 accuracy {when} ({f['role']})",
            metric_value=round(value, 6),
        )
        for task, f in evaluation.items()
        for when, value in (("after the edit", f["after"]), ("zero-shot", f["before"]))
    ]


def _evaluation_table(evaluation: dict[str, HeldOut]) -> str:
    rows = "\n".join(
        f"| {task} | {f['role']} | {f['before']:.3f} | {f['after']:.3f} | {f['delta_points']:+.1f} |"
        for task, f in evaluation.items()
    )
    return f"| task | role | zero-shot | edited | points |\n| --- | --- | --- | --- | --- |\n{rows}"
