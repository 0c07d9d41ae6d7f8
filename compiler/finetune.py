"""Making a source the paper's way: a rank-4 LoRA on the input tower's attention q and v
projections, trained with cross-entropy against the frozen text tower's class embeddings,
saved as a peft adapter folder that `ptc descriptor add --finetuned` accepts."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from targets.base import batch_rows, batch_to

from .bank import TaskRecord
from .descriptor import class_embeddings, normalise
from .fsio import staged_directory
from .labelled import labelled_files
from .lora import attach_lora, default_device, train

LOGIT_SCALE = 30.0


def finetune_lora(encoder, task: TaskRecord, data_dir: Path, out_dir: Path, *, rank: int = 4,
                  alpha: float = 8, steps: int = 250, lr: float = 2e-3, batch_size: int = 64,
                  seed: int = 0, progress: bool = True, replace: bool = False,
                  device: torch.device | None = None, echo: Callable[[str], None] | None = None) -> dict:
    device = device or default_device()
    pairs = labelled_files(data_dir, task.classes)
    inputs = batch_to(encoder.load_inputs([p for p, _ in pairs]), device)
    labels = torch.tensor([label for _, label in pairs], device=device)
    class_rows = class_embeddings(encoder.embed_prompts(task.prompts), len(task.classes)).float().to(device)
    module = attach_lora(encoder, rank, alpha, seed, device)
    generator = torch.Generator().manual_seed(seed)

    def step_loss(_step):
        batch = torch.randint(len(labels), (min(batch_size, len(labels)),), generator=generator).to(device)
        logits = LOGIT_SCALE * normalise(encoder.embed_with(module, batch_rows(inputs, batch))) @ class_rows.T
        accuracy = (logits.detach().argmax(1) == labels[batch]).float().mean().item()
        return torch.nn.functional.cross_entropy(logits, labels[batch]), {"acc": accuracy}

    if echo:  # progress bars are off when output is not a terminal: say that training has begun
        echo(f"training: {steps} steps on {len(labels)} examples of {task.name}")
    figures = train(module, steps, step_loss, lr, f"finetune {task.name}", progress)
    with staged_directory(Path(out_dir), replace=replace) as staging:
        module.save_pretrained(staging)
    return {"steps": steps, "final_loss": figures.get("loss", float("nan")),
            "final_batch_accuracy": figures.get("acc", float("nan")), "examples": len(labels)}
