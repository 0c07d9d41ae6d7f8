"""How far plain contrastive pretraining on the zoo world gets a tiny CLIP: zero-shot accuracy
per task on held-out images in the shifted (downstream) and the plain (pretraining) style,
and how distinct each task's class prompts are. The zoo's leading indicator, measured before
any zoo model is trained for real.

    python3 -m ptc.lab.benchmarks.zoo_feasibility --steps 1500 --out /tmp/zoo-feasibility
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch
from PIL import Image

from ptc import targets
from ptc.compiler.method.descriptor import class_embeddings, normalise
from ptc.compiler.tasks.grid import load_task
from ptc.compiler.tasks.labelled import labelled_files
from ptc.lab.tiny.hf_clip import build_tiny
from ptc.lab.zoo.pretrain import PretrainConfig
from ptc.lab.zoo.pretrain import pretrain as zoo_pretrain
from ptc.lab.zoo.world import (
    PLAIN,
    WorldSize,
    _digit_images,
    digit_pools,
    render,
    sample_scene,
    write_world,
)


def pretrain(encoder, root: Path, steps: int, batch_size: int = 128, lr: float = 1e-3):
    """The zoo's own pretraining loop on the world's captions; returns (trained encoder, figures)."""
    captions = [
        json.loads(line) for line in (root / "pretrain" / "captions.jsonl").read_text().splitlines()
    ]
    inputs = encoder.load_inputs([root / "pretrain" / c["image"] for c in captions])
    return zoo_pretrain(
        encoder,
        inputs,
        [c["caption"] for c in captions],
        PretrainConfig(steps=steps, batch_size=batch_size, lr=lr),
    )


def zero_shot(encoder, files: dict[str, Path], plain_per_class: int = 30) -> dict:
    digit_images, digit_targets = _digit_images()
    _, test_pool = digit_pools(digit_images)
    rng, figures = random.Random(7), {}
    for name, task_file in files.items():
        task = load_task(task_file)
        classes = normalise(
            class_embeddings(encoder.embed_prompts(task.prompts), len(task.classes)).double()
        )
        off_diagonal = (
            (classes @ classes.T)[~torch.eye(len(classes), dtype=torch.bool)].mean().item()
        )

        def accuracy(images, labels):
            z = normalise(
                encoder.embed_inputs(
                    {
                        "pixel_values": encoder.processor(images=images, return_tensors="pt")[
                            "pixel_values"
                        ]
                    }
                ).double()
            )
            return round(
                ((z @ classes.T).argmax(1) == torch.tensor(labels)).float().mean().item(), 3
            )

        pairs = labelled_files(task_file.parent / "test", task.classes)
        shifted = accuracy(
            [Image.open(p).convert("RGB") for p, _ in pairs], [label for _, label in pairs]
        )
        scenes = [
            sample_scene(rng, test_pool, digit_targets, fixed={name: c})
            for c in task.classes
            for _ in range(plain_per_class)
        ]
        plain = accuracy(
            [Image.fromarray(render(s, rng, digit_images, PLAIN)) for s in scenes],
            [task.classes.index(s.value(name)) for s in scenes],
        )
        figures[name] = {
            "shifted": shifted,
            "plain": plain,
            "chance": round(1 / len(task.classes), 3),
            "prompt_offdiag_cosine": round(off_diagonal, 3),
        }
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--pretrain", type=int, default=6000, help="captioned pretraining images")
    parser.add_argument("--template-share", type=float, default=0.3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--world", type=Path, default=None, help="reuse a world written earlier")
    parser.add_argument("--out", type=Path, default=Path("/tmp/zoo-feasibility"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    world = args.world or args.out / "world"
    if args.world is None:
        write_world(
            world,
            WorldSize(pretrain=args.pretrain, probes=50, train=10, test=30),
            template_share=args.template_share,
        )
    files = {p.parent.name: p for p in sorted((world / "tasks").glob("*/task.yaml"))}
    encoder = targets.load(
        f"hf:{build_tiny(args.out / 'clip', width=args.width, embed_dim=64, layers=4, heads=4, patch_size=4)}"
    )
    start = time.perf_counter()
    encoder, figures = pretrain(encoder, world, args.steps, lr=args.lr)
    result = {
        "steps": args.steps,
        "pretrain_images": args.pretrain,
        "train_seconds": round(time.perf_counter() - start, 1),
        "final_loss": round(figures["final_loss"], 3),
        "zero_shot": zero_shot(encoder, files),
    }
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
