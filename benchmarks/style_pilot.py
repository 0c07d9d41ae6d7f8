"""Would pretraining on a spread of styles make the zoo's shifted tasks readable? A pilot for
the next zoo change, scored on the labelled TRAIN split only (never test).

`ptc paper`'s headroom table finds the Oracle bounded by what the members' pre-trained
embeddings encode linearly of the shifted-style tasks. Web-trained CLIPs see images in every
style, so a shift such as EuroSAT's still lands in features that read it. This pretrains one
zoo member twice, the same steps on the same scenes and captions: once in the plain style the
zoo pretrains on, once in a spread of styles that stops short of the downstream shift on every
axis (background grey up to 0.5 against the shift's 0.55-0.7, up to 30% light grey mixed into
colours against its 45%, thin strokes only against its thick ones). It prints each one's
zero-shot accuracy and a labelled linear probe (cross-validated) per task.

    python3 -m ptc.lab.benchmarks.style_pilot [--zoo zoo] [--member clip] [--steps 2500] [--style plain|spread] [--seed 0]

Two --style runs side by side (one thread each, 2,500 steps) took 11 minutes for clip and 19 for vit on 2 cores.
The whole zoo pretrained in the spread (`WorldSize.pretrain_style`) read more but transferred
less: results/trials/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import tempfile
from pathlib import Path

import torch

from ptc import targets
from ptc.compiler.embed import embed_probe_files
from ptc.compiler.tasks.labelled import labelled_files
from ptc.compiler.verify.evaluate import zero_shot_accuracy
from ptc.lab.zoo import world
from ptc.lab.zoo.build import _pretrain_member, profile_named
from ptc.lab.zoo.headroom import linear_probe
from ptc.lab.zoo.paper import Zoo

TASKS = ("shape", "colour", "count", "size", "quadrant", "background", "count-plain")


def write_corpus(folder: Path, style: str, images: int, seed: int = 0) -> None:
    """The same scenes and captions for either style; only how each image is drawn differs.
    Another `seed` draws other scenes (seed 0 keeps the streams the README's figures came from)."""
    digits, targets_ = world._digit_images()
    fit_pool, _ = world.digit_pools(digits)
    stream = "style-pilot" if seed == 0 else f"style-pilot/{seed}"
    scenes, styles = random.Random(f"{stream}/scenes"), random.Random(f"{stream}/styles")
    lines = []
    for i in range(images):
        scene = world.sample_scene(scenes, fit_pool, targets_)
        caption = world.caption(scene, scenes)
        drawing = random.Random(scenes.random())  # one stream per image, the same for both styles
        chosen = world.PLAIN if style == "plain" else world.spread_style(styles)
        world.draw_scene(scene, folder / "images" / f"{i:06d}.png", drawing, digits, chosen)
        lines.append(json.dumps({world.INPUT_KEY: f"images/{i:06d}.png", "caption": caption}))
    (folder / "captions.jsonl").write_text("\n".join(lines) + "\n")


def pretrain(
    style: str, member_name: str, steps: int, images: int | None, seed: int, scratch: Path
):
    profile = profile_named("full")
    member = next(m for m in profile.members if m.name == member_name)
    member = dataclasses.replace(member, pretrain={**member.pretrain, "steps": steps})
    root = scratch / style
    write_corpus(root / "world" / "pretrain", style, images or profile.world.pretrain, seed)
    record = _pretrain_member(member, profile, root, print)
    return targets.load(record["ref"], root)


def scores(encoder, zoo: Zoo) -> dict:
    rows = {}
    for task in TASKS:
        # the train split: zoo opened on "train"
        record, folder = (
            zoo.bank.task(task),
            zoo.test_dir(task),
        )
        pairs = labelled_files(folder, record.classes)
        inputs = embed_probe_files(encoder, [p for p, _ in pairs], 64, task, False)
        rows[task] = {
            "zero_shot": 100
            * zero_shot_accuracy(encoder, record, folder, progress=False)["accuracy"],
            "linear_probe": 100 * linear_probe(inputs, torch.tensor([label for _, label in pairs])),
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    parser.add_argument("--member", default="clip")
    parser.add_argument("--steps", type=int, default=2500)
    parser.add_argument("--style", choices=("plain", "spread", "both"), default="both")
    parser.add_argument(
        "--images", type=int, default=None, help="pretraining images (default: the full zoo's)"
    )
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="which scenes the corpus draws (to see how noisy one run is)",
    )
    args = parser.parse_args()
    zoo = Zoo(args.zoo, split="train")
    for style in ("plain", "spread") if args.style == "both" else (args.style,):
        with tempfile.TemporaryDirectory() as scratch:
            encoder = pretrain(
                style, args.member, args.steps, args.images, args.seed, Path(scratch)
            )
            rows = scores(encoder, zoo)
        print(
            f"{args.member} pretrained {args.steps} steps in the {style} style, scene seed {args.seed} (train split, zero-shot / linear probe %): "
            + "; ".join(
                f"{task} {r['zero_shot']:.1f} / {r['linear_probe']:.1f}" for task, r in rows.items()
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
