"""The LoRA training loop shared by `ptc finetune` (sources) and `route: adapter` (edits):
peft wraps a copy of the encoder's torch module on the family's q/v projections; training is
deterministic under a seed and runs on a GPU when one is present."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ptc.errors import InputError
from ptc.progress import Progress
from ptc.targets.base import Family


def check_lora_dropout(encoder: Family, dropout: float) -> None:
    """Refuse a LoRA dropout rate the encoder's adapter cannot take, before any training."""
    if not 0 <= dropout < 1:
        raise InputError(
            f"LoRA dropout {dropout} is outside [0, 1)",
            "--lora-dropout takes 0 (none) or a rate such as 0.1",
        )
    if dropout and encoder.lora_targets.get("target_parameters"):
        # peft adds such a LoRA to the weight itself (ParamWrapper), where no input is dropped.
        raise InputError(
            f"{encoder.ref}: LoRA dropout needs LoRA on modules, and this model's adapts parameters "
            f"({encoder.lora_targets['target_parameters'][0]}, ...)",
            "use --lora-dropout 0 for it",
        )


def attach_lora(
    encoder: Family,
    rank: int,
    alpha: float | None,
    seed: int,
    device: torch.device,
    dropout: float = 0.0,
) -> Any:
    """A peft-wrapped copy of the encoder's module with only the LoRA factors trainable.
    `dropout` is peft's lora_dropout: applied to the LoRA branch's input while training only."""
    from peft import LoraConfig, get_peft_model

    check_lora_dropout(encoder, dropout)
    torch.manual_seed(seed)  # LoRA's A factors are drawn at attach time
    extra: dict[str, Any] = {} if alpha is None else {"lora_alpha": alpha}
    config = LoraConfig(r=rank, lora_dropout=dropout, **encoder.lora_targets, **extra)
    module = get_peft_model(encoder.trainable(), config).to(device)
    if not any(p.requires_grad for p in module.parameters()):
        raise ValueError(f"no module of {encoder.ref} matches {encoder.lora_targets!r}")
    return module


def train(
    module: torch.nn.Module,
    steps: int,
    step_loss: Callable[[int], tuple[torch.Tensor, dict[str, Any]]],
    lr: float,
    desc: str,
    progress: bool = True,
) -> dict[str, Any]:
    """Run `steps` AdamW steps of `step_loss(step) -> (loss, figures for the progress bar)`."""
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr)
    figures: dict[str, Any] = {}
    with Progress(steps, desc, "steps", progress) as bar:
        for step in range(steps):
            loss, figures = step_loss(step)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            figures = {"loss": loss.item(), **figures}
            bar.set_postfix(**{k: f"{v:.4g}" for k, v in figures.items()})
            bar.update()
    return figures
