"""The adapter route: a LoRA on the target's input-tower q/v projections, trained so that the
target's own affinity change on each grid matches that grid's scaled descriptors, all grids
jointly, probes weighted equally; then merged into the weights.

    loss = sum_grids mean_{i,j} (S(theta; x_i, c_j) - S_pre(x_i, c_j) - sum_l w_l U_l[i, j])^2

Each step reads and preprocesses its own batch of probe files: a grid held preprocessed whole
is 0.6 MB a probe at 224 px (1.2 GB for 2,000), while decoding a batch costs a small part of a
real-size training step, so memory stays the same whatever the grid's size.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ptc.compiler.edit.lora import attach_lora, train
from ptc.compiler.method.descriptor import affinity, summed
from ptc.targets.base import Family, batch_to


@dataclass(frozen=True)
class GridGoal:
    """What the adapter must reproduce on one grid (all tensors on the training device)."""

    name: str
    probes: tuple[Path, ...]  # the grid's N probe files, read a batch at a time
    class_rows: torch.Tensor  # M x d, the target's frozen text side
    pre_affinity: torch.Tensor  # N x M, the unedited target
    goal: torch.Tensor  # N x M, sum of w_l U_l over the grid's terms


def _batches(count: int, size: int, generator: torch.Generator) -> Iterator[torch.Tensor]:
    """Endless shuffled epochs of index batches over `count` probes."""
    while True:
        order = torch.randperm(count, generator=generator)
        for start in range(0, count, size):
            yield order[start : start + size]


def planned_steps(goals: list[GridGoal], batch_size: int, epochs: int, max_steps: int) -> int:
    per_epoch = max(math.ceil(len(g.probes) / batch_size) for g in goals)
    return min(epochs * per_epoch, max_steps)


def fit_adapter(
    encoder: Family,
    goals: list[GridGoal],
    out_dir: Path,
    *,
    rank: int,
    alpha: float | None,
    epochs: int,
    max_steps: int,
    lr: float,
    batch_size: int,
    seed: int,
    device: torch.device,
    progress: bool = True,
) -> tuple[Any, dict[str, Any]]:
    """Train, save the (unmerged) peft adapter to `out_dir`, return (module, stats)."""
    module = attach_lora(encoder, rank, alpha, seed, device)
    generator = torch.Generator().manual_seed(seed)
    streams = [_batches(len(g.probes), batch_size, generator) for g in goals]
    steps = planned_steps(goals, batch_size, epochs, max_steps)

    def step_loss(_step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        losses = []
        for goal, stream in zip(goals, streams):
            idx = next(stream)
            batch = batch_to(encoder.load_inputs([goal.probes[i] for i in idx.tolist()]), device)
            idx = idx.to(device)
            moved = (
                affinity(encoder.embed_with(module, batch), goal.class_rows)
                - goal.pre_affinity[idx]
            )
            losses.append((moved - goal.goal[idx]).square().mean())
        return summed(losses), {}

    figures = train(module, steps, step_loss, lr, "adapter", progress)
    module.eval()
    module.save_pretrained(out_dir)
    return module, {
        "steps": steps,
        "final_loss": figures.get("loss"),
        "rank": rank,
        "alpha": module.peft_config["default"].lora_alpha,
        "seed": seed,
        "lr": lr,
        "device": str(device),
    }
