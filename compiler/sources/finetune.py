"""Making a source the paper's way: a rank-4 LoRA on the input tower's attention q and v
projections, trained with cross-entropy against the frozen text tower's class embeddings,
saved as a peft adapter folder that `ptc descriptor add --finetuned` accepts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ptc.compiler.bank.store import TaskRecord
from ptc.compiler.edit.lora import attach_lora, train
from ptc.compiler.method.descriptor import class_embeddings, normalise
from ptc.compiler.tasks.labelled import labelled_files
from ptc.devices import device_label, resolve_device
from ptc.output_dirs import staged_directory
from ptc.targets.base import Family, batch_rows, batch_to

LOGIT_SCALE = 30.0


def finetune_lora(
    encoder: Family,
    task: TaskRecord,
    data_dir: Path,
    out_dir: Path,
    *,
    rank: int = 4,
    alpha: float = 8,
    steps: int = 250,
    lr: float = 2e-3,
    batch_size: int = 64,
    seed: int = 0,
    dropout: float = 0.0,
    progress: bool = True,
    replace: bool = False,
    device: torch.device | None = None,
    echo: Callable[[str], None] | None = None,
    base_ref: str | None = None,
) -> dict[str, Any]:
    """Train a LoRA on the task's labelled files and save it as a peft adapter in `out_dir`.
    The adapter's config names `base_ref` (default: the encoder's reference) as its base model,
    not whatever folder the library happened to load it from. `dropout` (peft's lora_dropout,
    recorded in the adapter's config) regularises training and changes nothing at inference."""
    device = device or resolve_device()
    pairs = labelled_files(data_dir, task.classes)
    inputs = batch_to(encoder.load_inputs([p for p, _ in pairs]), device)
    labels = torch.tensor([label for _, label in pairs], device=device)
    class_rows = (
        class_embeddings(encoder.embed_prompts(task.prompts), len(task.classes)).float().to(device)
    )
    module = attach_lora(encoder, rank, alpha, seed, device, dropout)
    generator = torch.Generator().manual_seed(seed)

    def step_loss(_step: int) -> tuple[torch.Tensor, dict[str, Any]]:
        batch = torch.randint(len(labels), (min(batch_size, len(labels)),), generator=generator).to(
            device
        )
        logits = (
            LOGIT_SCALE
            * normalise(encoder.embed_with(module, batch_rows(inputs, batch)))
            @ class_rows.T
        )
        accuracy = (logits.detach().argmax(1) == labels[batch]).float().mean().item()
        return torch.nn.functional.cross_entropy(logits, labels[batch]), {"acc": accuracy}

    if echo:  # progress bars are off when output is not a terminal: say that training has begun
        echo(f"training: {steps} steps on {len(labels)} examples of {task.name}")
    figures = train(module, steps, step_loss, lr, f"finetune {task.name}", progress)
    base_ref = base_ref or encoder.ref
    for config in module.peft_config.values():  # peft would record the folder it was loaded from
        config.base_model_name_or_path = base_ref
    with staged_directory(Path(out_dir), replace=replace) as staging:
        # No embedding layer is trained; "auto" would look base_ref up on the Hub to decide.
        module.save_pretrained(staging, save_embedding_layers=False)
        (staging / "README.md").write_text(
            _model_card(base_ref, task.name, rank, steps, seed, len(labels), dropout)
        )
    return {
        "steps": steps,
        "final_loss": figures.get("loss", float("nan")),
        "final_batch_accuracy": figures.get("acc", float("nan")),
        "examples": len(labels),
        "device": device_label(device),
    }


def _model_card(
    base_ref: str, task: str, rank: int, steps: int, seed: int, examples: int, dropout: float
) -> str:
    """In place of peft's blank template, which names the loading folder as the base model."""
    settings = f"seed {seed}, LoRA dropout {dropout:g}" if dropout else f"seed {seed}"
    return (
        f"---\nbase_model: {base_ref}\nlibrary_name: peft\ntags:\n- lora\n- ptc\n---\n\n"
        f"# A `{task}` source for {base_ref}\n\n"
        f"`ptc finetune`: a rank-{rank} LoRA on the input tower's attention q and v projections, "
        f"{steps} steps ({settings}) on {examples} labelled examples of `{task}`, trained with "
        f"cross-entropy against the frozen text tower's class prompts.\n"
    )
