"""What refusing damaged checkpoints costs at real size, side by side with what a build does anyway.

For each real CLIP architecture (random weights, built from its public config): the finite test
over every weight (`ptc.finite.first_non_finite`, as every loader runs it), building the model
on the meta device (the size check before loading), and one forward pass of the image tower on
a batch of 8 images at 224 px (a build's smallest unit of embedding work; a cold build at the
real-size benchmark's grid runs 48 of them). Each figure is the median of 3 runs in this process.

    python benchmarks/finite_checks.py [vit-b16 vit-l14 ...] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform

import torch

from ptc.lab.benchmarks.suite import _median_seconds as median_seconds


def measure(name: str) -> dict:
    from transformers import CLIPConfig, CLIPModel

    from ptc.finite import first_non_finite
    from ptc.lab.real_size import CONFIGS
    from ptc.targets.checkpoint import declared_shapes

    spec = CONFIGS[name]
    config = CLIPConfig(
        text_config={**spec["text"], "vocab_size": 49408, "max_position_embeddings": 77},
        vision_config=spec["vision"],
        projection_dim=spec["projection_dim"],
    )
    torch.manual_seed(0)
    model = CLIPModel(config).eval()
    weights = model.state_dict()
    values = sum(t.numel() for t in weights.values())
    pixels = torch.randn(8, 3, 224, 224)
    with torch.inference_mode():
        forward = median_seconds(lambda: model.get_image_features(pixel_values=pixels), 3)
    finite = median_seconds(lambda: first_non_finite(weights), 3)
    meta = median_seconds(lambda: declared_shapes(lambda: CLIPModel(config)), 3)
    return {
        "values": values,
        "model_bytes": 4 * values,
        "forward_batch8_seconds": forward,
        "finite_check_seconds": finite,
        "meta_build_seconds": meta,
        "checks_over_one_batch": (finite + meta) / forward,
        "checks_over_cold_embed_floor_384_probes": (finite + meta) / (forward * 384 / 8),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="*", default=["vit-b16", "vit-l14"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "threads": torch.get_num_threads(),
        },
        "sizes": {},
    }
    for name in args.sizes:
        figures = measure(name)
        results["sizes"][name] = figures
        print(
            f"{name}: {figures['values'] / 1e6:.0f}M values; finite test {figures['finite_check_seconds']:.3f} s, "
            f"meta build {figures['meta_build_seconds']:.3f} s, one forward of 8 images "
            f"{figures['forward_batch8_seconds']:.3f} s: checks = {figures['checks_over_one_batch']:.2f} batches, "
            f"{100 * figures['checks_over_cold_embed_floor_384_probes']:.1f}% of embedding 384 probes",
            flush=True,
        )
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
