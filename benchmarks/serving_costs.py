"""What shipping for serving costs at real size, side by side with what it buys.

For each real CLIP architecture (random weights, built from its public config): the serving
contract's text check (the edited model's text tower on the 65 prompts a build checks at most,
20 tokens each), exporting the image tower to ONNX, quantising it to int8
(`compiler/export/int8.py`), each graph's size, and onnxruntime's time for a batch of 8
images at 224 px in fp32 and int8 (median of 3, after one warm-up run), with the lowest
cosine between the two. Random weights say nothing of a trained model's int8 cosine; the
build measures that on every output.

    python benchmarks/serving_costs.py [vit-b16 vit-l14 ...] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ptc.lab.benchmarks.suite import _median_seconds as median_seconds


def _timed(work) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def measure(name: str, folder: Path) -> dict:
    import onnxruntime as ort
    from transformers import CLIPConfig, CLIPModel

    from ptc.compiler.export.int8 import int8_variant
    from ptc.compiler.export.onnx_graph import export_onnx, onnx_files
    from ptc.lab.real_size import CONFIGS
    from ptc.targets.base import OnnxTower
    from ptc.targets.hf_clip import _ImageTower

    spec = CONFIGS[name]
    config = CLIPConfig(
        text_config={**spec["text"], "vocab_size": 49408, "max_position_embeddings": 77},
        vision_config=spec["vision"],
        projection_dim=spec["projection_dim"],
    )
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    ids = torch.randint(0, 49000, (65, 20))
    with torch.inference_mode():
        text = median_seconds(
            lambda: model.get_text_features(input_ids=ids, attention_mask=torch.ones_like(ids)), 3
        )
    size = spec["vision"].get("image_size", 224)
    fp32, int8 = folder / f"{name}.onnx", folder / f"{name}_int8.onnx"
    tower = OnnxTower(
        "vision_model",
        _ImageTower(model).eval(),
        {"pixel_values": torch.zeros(2, 3, size, size)},
        "image_embeds",
        {"pixel_values": {0: "batch"}},
    )
    export = _timed(lambda: export_onnx(tower, fp32))
    quantise = _timed(lambda: int8_variant(fp32, int8, {}))
    pixels = np.random.default_rng(0).standard_normal((8, 3, size, size)).astype(np.float32)
    figures: dict = {"text_check_65_prompts_seconds": text, "export_fp32_seconds": export}
    outputs = {}
    for label, path in (("fp32", fp32), ("int8", int8)):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        session.run(None, {"pixel_values": pixels[:2]})
        outputs[label] = session.run(None, {"pixel_values": pixels})[0]
        figures[f"{label}_bytes"] = sum(f.stat().st_size for f in onnx_files(path))
        figures[f"{label}_batch8_seconds"] = median_seconds(
            lambda s=session: s.run(None, {"pixel_values": pixels}), 3
        )
    a, b = outputs["fp32"], outputs["int8"]
    figures.update(
        quantise_seconds=quantise,
        int8_size_ratio=figures["int8_bytes"] / figures["fp32_bytes"],
        int8_speedup=figures["fp32_batch8_seconds"] / figures["int8_batch8_seconds"],
        int8_min_cosine_random_weights=float(
            ((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min()
        ),
    )
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", default=["vit-b16"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results: dict = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "threads": torch.get_num_threads(),
        },
        "sizes": {},
    }
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.sizes:
            f = results["sizes"][name] = measure(name, Path(scratch))
            print(
                f"{name}: text check {f['text_check_65_prompts_seconds']:.2f} s; export "
                f"{f['export_fp32_seconds']:.1f} s, int8 quantise {f['quantise_seconds']:.1f} s; "
                f"int8 {f['int8_size_ratio']:.2f}x the bytes, {f['int8_speedup']:.2f}x the speed "
                f"of fp32 (batch 8: {f['fp32_batch8_seconds']:.2f} s vs "
                f"{f['int8_batch8_seconds']:.2f} s), lowest cosine "
                f"{f['int8_min_cosine_random_weights']:.5f} (random weights)",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
