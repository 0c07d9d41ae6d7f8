"""onnxruntime's images per run: speed and memory at two sizes, side by side in one run.

A build embeds its target's grids through the base export in an onnxruntime session beside the
torch model (compiler/export/onnx_embed.py), so what the session holds adds to the build's
peak. Its weights are the graph's bytes whatever it runs; its activations grow with the images
per `session.run`. Here ViT-B/16's image tower (random weights, its public config) is exported
once, and the same 64 images are embedded in batches of 64 through `session_forward` at two
values of SESSION_BATCH, alternating, each in a fresh interpreter whose peak RSS (VmHWM) above
what it held before opening the session is read at its end.

    python benchmarks/session_batch.py [--size vit-b16] [--batches 64 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

RUN = """
import sys, time
import torch
from ptc.compiler.build.report import peak_rss_mb
from ptc.compiler.export import onnx_embed
onnx_embed.SESSION_BATCH = int(sys.argv[2])
images = torch.randn(64, 3, 224, 224, generator=torch.Generator().manual_seed(0))
before = peak_rss_mb()
forward = onnx_embed.session_forward(sys.argv[1])
forward({"pixel_values": images[:2]})  # warm-up
start = time.perf_counter()
for _ in range(int(sys.argv[3])):
    z, _ = forward({"pixel_values": images})
seconds = time.perf_counter() - start
print(seconds, peak_rss_mb() - before, float(z.abs().sum()))
"""
IMAGES = 64


def export_tower(size: str, folder: Path) -> Path:
    from ptc import targets
    from ptc.compiler.export.onnx_graph import export_onnx
    from ptc.lab.real_size import build_clip

    model = targets.load(f"hf:{build_clip(folder / 'model', size)}")
    path = folder / "vision_model.onnx"
    export_onnx(model.onnx_towers()[0], path)
    return path


def measure(graph: Path, batch: int, repeats: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", RUN, str(graph), str(batch), str(repeats)],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds, rss_mb, checksum = (float(x) for x in result.stdout.split())
    return {
        "session_batch": batch,
        "images_per_second": repeats * IMAGES / seconds,
        "peak_rss_above_start_mb": rss_mb,
        "checksum": checksum,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="vit-b16")
    parser.add_argument("--batches", type=int, nargs=2, default=[64, 8])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).with_name("results-session-batch.json")
    )
    args = parser.parse_args()
    from ptc.lab.benchmarks.real_size import machine

    with tempfile.TemporaryDirectory(prefix="ptc-session-batch-") as folder:
        graph = export_tower(args.size, Path(folder))
        graph_mb = sum(f.stat().st_size for f in graph.parent.glob("vision_model.onnx*")) / 2**20
        runs = []
        for _ in range(args.rounds):
            for batch in args.batches:
                runs.append(measure(graph, batch, args.repeats))
                print(json.dumps(runs[-1]), flush=True)
    first = runs[0]["checksum"]
    if any(abs(r["checksum"] - first) > 1e-5 * abs(first) for r in runs):
        raise SystemExit(f"the batch sizes gave different embeddings: {runs}")
    summary = {}
    for batch in args.batches:
        mine = [r for r in runs if r["session_batch"] == batch]
        summary[str(batch)] = {
            "images_per_second": max(r["images_per_second"] for r in mine),
            "peak_rss_above_start_mb": max(r["peak_rss_above_start_mb"] for r in mine),
        }
    large, small = (summary[str(b)] for b in args.batches)
    results = {
        "machine": machine(),
        "size": args.size,
        "graph_mb": graph_mb,
        "images": IMAGES,
        "runs": runs,
        "best": summary,
        "speed_small_over_large": small["images_per_second"] / large["images_per_second"],
        "memory_small_over_large": small["peak_rss_above_start_mb"]
        / large["peak_rss_above_start_mb"],
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    b_large, b_small = args.batches
    print(
        f"{args.size} ({graph_mb:.0f} MB graph): runs of {b_small} images at "
        f"{results['speed_small_over_large']:.2f}x the speed of runs of {b_large}, holding "
        f"{small['peak_rss_above_start_mb']:.0f} MB against {large['peak_rss_above_start_mb']:.0f} MB "
        f"above the interpreter; written to {args.out}"
    )


if __name__ == "__main__":
    main()
