"""Making a source the paper's way: a rank-4 LoRA on the input tower's attention q and v
projections, trained with cross-entropy against the frozen text tower's class embeddings,
saved as a peft adapter folder that `ptc descriptor add --finetuned` accepts."""

from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from .bank import TaskRecord
from .descriptor import class_embeddings, normalise
from .fsio import staged_directory
from .labelled import labelled_files

LOGIT_SCALE = 30.0


def finetune_lora(encoder, task: TaskRecord, data_dir: Path, out_dir: Path, *, rank: int = 4,
                  alpha: int = 8, steps: int = 250, lr: float = 2e-3, batch_size: int = 64,
                  seed: int = 0, progress: bool = True, replace: bool = False) -> dict:
    from peft import LoraConfig, get_peft_model

    pairs = labelled_files(data_dir, task.classes)
    torch.manual_seed(seed)
    inputs = encoder.load_inputs([p for p, _ in pairs])
    labels = torch.tensor([label for _, label in pairs])
    class_rows = class_embeddings(encoder.embed_prompts(task.prompts), len(task.classes)).float()
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=encoder.lora_target_modules)
    module = get_peft_model(encoder.trainable(), config)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=lr)
    generator = torch.Generator().manual_seed(seed)
    bar = tqdm(range(steps), desc=f"finetune {task.name}", disable=None if progress else True, leave=False)
    loss = accuracy = float("nan")
    for _ in bar:
        batch = torch.randint(len(labels), (min(batch_size, len(labels)),), generator=generator)
        logits = LOGIT_SCALE * normalise(encoder.embed_with(module, inputs[batch])) @ class_rows.T
        step_loss = torch.nn.functional.cross_entropy(logits, labels[batch])
        optimizer.zero_grad()
        step_loss.backward()
        optimizer.step()
        loss = step_loss.item()
        accuracy = (logits.detach().argmax(1) == labels[batch]).float().mean().item()
        bar.set_postfix(loss=f"{loss:.3f}", acc=f"{accuracy:.2f}")
    with staged_directory(Path(out_dir), replace=replace) as staging:
        module.save_pretrained(staging)
    return {"steps": steps, "final_loss": loss, "final_batch_accuracy": accuracy, "examples": len(labels)}
