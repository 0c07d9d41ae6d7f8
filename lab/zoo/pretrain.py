"""Contrastive pretraining of a dual encoder on captioned inputs, through the family protocol
only (`trainable`, `embed_with`, `embed_prompts_with`, `with_module`), so one loop trains
every zoo member, whatever its library.

The loss is the family's own: CLIP's symmetric softmax (InfoNCE) or SigLIP's pairwise sigmoid,
with a learnable temperature (and, for sigmoid, a bias) started where each recipe starts it:
log(1/0.07) for softmax; log 10 and -10 for sigmoid. World captions repeat (a template filled
with one attribute), so every pair with the same caption counts as a positive, not as a
false negative.
"""

from __future__ import annotations

import math

import torch

from ptc.targets.base import Batch, batch_len, batch_rows, batch_to

from ptc.compiler.method.descriptor import normalise
from ptc.devices import device_label, resolve_device
from ptc.progress import Progress
from ptc.lab.zoo.profiles import PretrainConfig  # noqa: F401  (re-exported: the loop's settings)

LOGIT_SCALE_INIT = {"softmax": math.log(1 / 0.07), "sigmoid": math.log(10.0)}
SIGMOID_BIAS_INIT = -10.0
MAX_LOGIT_SCALE = 100.0


def contrastive_loss(kind: str, inputs: torch.Tensor, texts: torch.Tensor, positives: torch.Tensor,
                     log_scale: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Loss of normalised input and text rows (n x d each); `positives` (n x n, bool) marks
    the pairs that share a caption (the diagonal always)."""
    logits = log_scale.exp().clamp(max=MAX_LOGIT_SCALE) * inputs @ texts.T
    if kind == "softmax":
        targets = positives.float() / positives.sum(dim=1, keepdim=True)
        return (torch.nn.functional.cross_entropy(logits, targets)
                + torch.nn.functional.cross_entropy(logits.T, targets.T)) / 2
    if kind == "sigmoid":
        signs = 2 * positives.float() - 1
        return -torch.nn.functional.logsigmoid(signs * (logits + bias)).sum(dim=1).mean()
    raise ValueError(f"unknown contrastive loss {kind!r} (expected 'softmax' or 'sigmoid')")


def _schedule(config: PretrainConfig):
    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / max(1, config.warmup))
        return warm * 0.5 * (1 + math.cos(math.pi * min(step, config.steps) / config.steps))
    return factor


def pretrain(encoder, inputs: Batch, captions: list[str], config: PretrainConfig, *, desc: str = "pretrain",
             progress: bool = True, device: torch.device | None = None):
    """Train a copy of `encoder` on (inputs[i], captions[i]) pairs; return (trained encoder,
    figures). Deterministic under `config.seed` on a given device."""
    if batch_len(inputs) != len(captions) or not captions:
        raise ValueError(f"{batch_len(inputs)} inputs but {len(captions)} captions")
    device = device or resolve_device()
    torch.manual_seed(config.seed)
    module = encoder.trainable().to(device).train()  # train: batch norm (ResNet towers) learns its statistics
    kind = encoder.contrastive_loss
    log_scale = torch.nn.Parameter(torch.tensor(LOGIT_SCALE_INIT[kind], device=device))
    bias = torch.nn.Parameter(torch.tensor(SIGMOID_BIAS_INIT, device=device))
    optimizer = torch.optim.AdamW([{"params": [p for p in module.parameters() if p.requires_grad]},
                                   {"params": [log_scale, bias], "weight_decay": 0.0}],
                                  lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(config))
    caption_ids = torch.tensor(_caption_ids(captions))
    generator = torch.Generator().manual_seed(config.seed)
    batch_size = min(config.batch_size, len(captions))
    losses: list[float] = []
    with Progress(config.steps, desc, "steps", progress) as bar:
        for _ in range(config.steps):
            index = torch.randperm(len(captions), generator=generator)[:batch_size]
            image = normalise(encoder.embed_with(module, batch_to(batch_rows(inputs, index), device)))
            text = normalise(encoder.embed_prompts_with(module, [captions[i] for i in index.tolist()]))
            same = caption_ids[index]
            loss = contrastive_loss(kind, image, text, (same[:, None] == same[None, :]).to(device), log_scale, bias)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
            recent = losses[-50:]
            bar.set_postfix(loss=f"{sum(recent) / len(recent):.3f}")
            bar.update()
    tail = losses[-50:]
    figures = {"steps": config.steps, "loss": kind, "final_loss": sum(tail) / len(tail),
               "logit_scale": float(log_scale.detach().exp()), "pairs": len(captions), "device": device_label(device)}
    return encoder.with_module(module.cpu().eval()), figures


def _caption_ids(captions: list[str]) -> list[int]:
    """A small integer per distinct caption, in order of first appearance."""
    ids: dict[str, int] = {}
    return [ids.setdefault(text, len(ids)) for text in captions]
