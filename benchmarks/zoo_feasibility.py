"""How far plain contrastive pretraining on the zoo world gets a tiny CLIP: zero-shot accuracy
per task on held-out images in the shifted (downstream) and the plain (pretraining) style,
and how distinct each task's class prompts are. The zoo's leading indicator, measured before
any zoo model is trained for real.

    python3 -m benchmarks.zoo_feasibility --steps 1500 --out /tmp/zoo-feasibility
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from PIL import Image

import targets
from compiler.descriptor import class_embeddings, normalise
from compiler.grid import load_task
from compiler.labelled import labelled_files
from compiler.zoo.world import TEST_DIGITS, WorldSize, _digit_images, render, sample_scene, write_world
from targets.hf_clip import build_tiny


def pretrain(encoder, root: Path, steps: int, batch_size: int = 128, lr: float = 1e-3) -> list[float]:
    """InfoNCE on the world's captions, AdamW with warm-up and cosine decay; returns losses."""
    captions = [json.loads(line) for line in (root / "pretrain" / "captions.jsonl").read_text().splitlines()]
    pixels = encoder.processor(images=[Image.open(root / "pretrain" / c["image"]).convert("RGB") for c in captions],
                               return_tensors="pt")["pixel_values"]
    tokens = encoder.tokenizer([c["caption"] for c in captions], padding="max_length", truncation=True,
                               max_length=encoder.max_length, return_tensors="pt")
    model = encoder.model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / steps)))
    generator, labels, losses = torch.Generator().manual_seed(0), torch.arange(batch_size), []
    for _ in range(steps):
        index = torch.randint(len(captions), (batch_size,), generator=generator)
        image = normalise(model.get_image_features(pixel_values=pixels[index]).pooler_output)
        text = normalise(model.get_text_features(input_ids=tokens["input_ids"][index],
                                                 attention_mask=tokens["attention_mask"][index]).pooler_output)
        logits = model.logit_scale.exp().clamp(max=100) * image @ text.T
        loss = (torch.nn.functional.cross_entropy(logits, labels) + torch.nn.functional.cross_entropy(logits.T, labels)) / 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    model.eval()
    return losses


def zero_shot(encoder, files: dict[str, Path], plain_per_class: int = 30) -> dict:
    digit_images, digit_targets = _digit_images()
    test_pool = list(range(len(digit_images) - TEST_DIGITS, len(digit_images)))
    rng, figures = random.Random(7), {}
    for name, task_file in files.items():
        task = load_task(task_file)
        classes = normalise(class_embeddings(encoder.embed_prompts(task.prompts), len(task.classes)).double())
        off_diagonal = (classes @ classes.T)[~torch.eye(len(classes), dtype=torch.bool)].mean().item()

        def accuracy(images, labels):
            z = normalise(encoder.embed_inputs(
                {"pixel_values": encoder.processor(images=images, return_tensors="pt")["pixel_values"]}).double())
            return round(((z @ classes.T).argmax(1) == torch.tensor(labels)).float().mean().item(), 3)

        pairs = labelled_files(task_file.parent / "test", task.classes)
        shifted = accuracy([Image.open(p).convert("RGB") for p, _ in pairs], [label for _, label in pairs])
        scenes = [sample_scene(rng, test_pool, digit_targets, fixed={name: c})
                  for c in task.classes for _ in range(plain_per_class)]
        plain = accuracy([Image.fromarray(render(s, rng, digit_images, shifted=False)) for s in scenes],
                         [task.classes.index(s.value(name)) for s in scenes])
        figures[name] = {"shifted": shifted, "plain": plain, "chance": round(1 / len(task.classes), 3),
                         "prompt_offdiag_cosine": round(off_diagonal, 3)}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--pretrain", type=int, default=6000, help="captioned pretraining images")
    parser.add_argument("--out", type=Path, default=Path("/tmp/zoo-feasibility"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    files = write_world(args.out / "world", WorldSize(pretrain=args.pretrain, probes=50, train=10, test=30))
    encoder = targets.load(f"hf:{build_tiny(args.out / 'clip', width=64, embed_dim=64, layers=4, heads=4, patch_size=4)}")
    start = time.perf_counter()
    losses = pretrain(encoder, args.out / "world", args.steps)
    result = {"steps": args.steps, "pretrain_images": args.pretrain, "train_seconds": round(time.perf_counter() - start, 1),
              "final_loss": round(sum(losses[-50:]) / len(losses[-50:]), 3), "zero_shot": zero_shot(encoder, files)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
