"""Seconds per pretraining step of every full-profile member, the committed shapes against a
SHAPES table's (benchmarks/rebuild_trial.py), measured side by side in one run on a small
world of the full profile's kind: what a shape trial's time estimate rests on.

    python3 -m ptc.lab.benchmarks.step_time [--shapes wide-1.5] [--steps 25] [--images 512]

About a minute for the world and 30 s per member on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

from ptc import targets
from ptc.lab.benchmarks.rebuild_trial import SHAPES, changed_profile
from ptc.lab.zoo.build import _builder, profile_named, write_world_once
from ptc.lab.zoo.pretrain import pretrain


def seconds_per_step(member, world: Path, steps: int, pretrain_config) -> tuple[float, float]:
    """(trainable parameters in millions, seconds per step) of `member` pretrained `steps` steps."""
    captions = [
        json.loads(line)
        for line in (world / "pretrain" / "captions.jsonl").read_text().splitlines()
    ]
    with tempfile.TemporaryDirectory() as scratch:
        encoder = targets.load(
            f"{member.scheme}:{_builder(member)(Path(scratch) / 'init', seed=0, **member.options)}"
        )
    inputs = encoder.load_inputs([world / "pretrain" / c["image"] for c in captions])
    params = sum(p.numel() for p in encoder.trainable().parameters()) / 1e6
    start = time.perf_counter()
    pretrain(
        encoder,
        inputs,
        [c["caption"] for c in captions],
        dataclasses.replace(pretrain_config, steps=steps, warmup=5),
        progress=False,
    )
    return params, (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", choices=sorted(SHAPES), default="wide-1.5")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--images", type=int, default=512)
    args = parser.parse_args()
    full = profile_named("full")
    small = dataclasses.replace(
        full,
        world=dataclasses.replace(full.world, pretrain=args.images),
        tasks=(),
        in_distribution_tasks=(),
    )
    shaped = changed_profile(small, None, 1, args.shapes)
    with tempfile.TemporaryDirectory() as root:
        write_world_once(Path(root), small, echo=lambda _: None)
        for committed, wide in zip(small.members, shaped.members):
            (p0, s0), (p1, s1) = (
                seconds_per_step(m, Path(root) / "world", args.steps, full.pretrain)
                for m in (committed, wide)
            )
            steps = committed.pretrain.get("steps", full.pretrain.steps)
            print(
                f"{committed.name:7s} params {p0:5.2f} -> {p1:5.2f} M   s/step {s0:.3f} -> {s1:.3f} "
                f"(x{s1 / s0:.2f}; {steps:,} steps: {s1 * steps:,.0f} s)",
                flush=True,
            )


if __name__ == "__main__":
    main()
