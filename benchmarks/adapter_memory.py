"""The adapter route's peak memory at two grid sizes, side by side in one run.

The route trains a LoRA on the target's input tower over every probe of its grids. Each step
reads and preprocesses its own batch of files (compiler/edit/adapter.py), so a grid is never
held preprocessed whole: at 224 px that would be 0.6 MB a probe. Here the same build (a
2-layer ViT at 224 px with the real CLIP tokenizer, `vit-tiny16`; source `vit-tiny32` with a
random rank-4 LoRA; route: adapter, 40 steps of 32; no export) runs at two probe counts, each in
a fresh interpreter whose own peak RSS (VmHWM) is read at its end, beside what holding the
grid's preprocessed inputs whole would add.

    python benchmarks/adapter_memory.py [--counts 64 512] [--out results-adapter-memory.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

BUILD = """
import sys
from ptc.compiler.cli.main import main
from ptc.compiler.build.report import peak_rss_mb
try:
    main(["-q", "build", sys.argv[1], "--no-export"])
except SystemExit as done:
    if done.code:
        raise
print("peak_rss_mb", peak_rss_mb())
"""
STEPS, BATCH = 40, 32


def measure(count: int, folder: Path) -> dict:
    from ptc.lab.benchmarks.real_size import _adapter, _write_task, ptc
    from ptc.lab.real_size import build_clip

    target = build_clip(folder / "target", "vit-tiny16", seed=0)
    source = build_clip(folder / "source", "vit-tiny32", seed=1)
    task_file = _write_task(folder / "task", count, 20)
    bank = folder / "bank"
    ptc("task", "add", str(task_file), "--bank", str(bank))
    ptc("descriptor", "add", "--task", "bench", "--source", f"hf:{source}", "--finetuned",
        str(_adapter(f"hf:{source}", folder / "lora")), "--id", "source", "--bank", str(bank))  # fmt: skip
    recipe = folder / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "target": f"hf:{target}",
                "bank": str(bank),
                "terms": [{"task": "bench", "source": "source", "weight": 1.0}],
                "route": "adapter",
                "adapter": {"max_steps": STEPS, "batch_size": BATCH},
            },
            sort_keys=False,
        )
    )
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", BUILD, str(recipe)], capture_output=True, text=True, check=True
    )
    return {
        "probes": count,
        "build_seconds": time.perf_counter() - start,
        "peak_rss_mb": float(result.stdout.split()[-1]),
        # what a grid preprocessed whole would hold: N x 3 x 224 x 224 float32
        "grid_held_whole_mb": count * 3 * 224 * 224 * 4 / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--counts", type=int, nargs=2, default=[64, 512])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).with_name("results-adapter-memory.json")
    )
    args = parser.parse_args()
    from ptc.lab.benchmarks.real_size import machine

    rows = []
    for count in args.counts:
        with tempfile.TemporaryDirectory(prefix="ptc-adapter-memory-") as folder:
            rows.append(measure(count, Path(folder)))
            print(json.dumps(rows[-1]), flush=True)
    small, large = rows
    results = {
        "machine": machine(),
        "steps": STEPS,
        "batch_size": BATCH,
        "runs": rows,
        "peak_rss_growth_mb": large["peak_rss_mb"] - small["peak_rss_mb"],
        "held_whole_growth_mb": large["grid_held_whole_mb"] - small["grid_held_whole_mb"],
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(
        f"peak RSS {small['peak_rss_mb']:.0f} MB at {small['probes']} probes, "
        f"{large['peak_rss_mb']:.0f} MB at {large['probes']}: "
        f"+{results['peak_rss_growth_mb']:.0f} MB, against +{results['held_whole_growth_mb']:.0f} MB "
        f"for the grid held whole; written to {args.out}"
    )


if __name__ == "__main__":
    main()
