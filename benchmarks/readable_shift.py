"""Does a downstream style misread a task, or remove it? On the committed members, no split used.

For each candidate style, draws PER_CLASS images per class of each task from a random stream of
its own (no probe, train or test image), and prints the members' zero-shot accuracy beside a
labelled linear probe on their embeddings (5-fold, `headroom.linear_probe`). A style in which
the probe reads a task well and zero-shot does not is a EuroSAT for the zoo: the members'
embeddings hold the task and only the text side misreads it, the headroom a linear edit can take.
A style in which both are low has removed the task from the image.

The candidates: the shared shift, each of its three parts alone (the bright background, the
wash, the thick strokes), the plain style and its negative, and a false-colour sensor at several
mixes (`world.Style.false_colour`). results/trials/README.md records what they showed.

    python3 -m ptc.lab.benchmarks.readable_shift [--zoo zoo] [--tasks colour size shape count]

About 15 s per task on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import tempfile
from pathlib import Path

import numpy as np
import torch

from ptc.compiler.embed import embed_probe_files
from ptc.compiler.method.descriptor import normalise
from ptc.compiler.tasks.labelled import labelled_files
from ptc.lab.zoo import headroom, world
from ptc.lab.zoo.paper import Zoo

PER_CLASS = 40
SHIFTED, PLAIN = world.SHIFTED, world.PLAIN
STYLES = {
    "plain": PLAIN,
    "shared shift": SHIFTED,
    "shared shift, thin strokes": dataclasses.replace(SHIFTED, stroke=1),
    "shared shift, no wash": dataclasses.replace(SHIFTED, wash=0.0),
    "shared shift, plain-range background": dataclasses.replace(SHIFTED, grey=PLAIN.grey),
    "negative": dataclasses.replace(PLAIN, negative=True),
    **{
        f"false colour {w:g}": dataclasses.replace(PLAIN, false_colour=w)
        for w in (0.25, 0.3, 0.32, 0.34, 0.4, 1.0)
    },
}


def draw(folder: Path, task: str, style: world.Style) -> None:
    """PER_CLASS images per class of `task` in `style`, from a stream no world split draws from
    (the same scenes in every style)."""
    images, targets = world._digit_images()
    fit_pool, _ = world.digit_pools(images)
    world.draw_labelled(
        folder,
        task,
        style,
        random.Random(f"readable-shift/{task}"),
        fit_pool,
        PER_CLASS,
        (images, targets),
    )


def read(zoo: Zoo, member: str, task: str, folder: Path) -> tuple[float, float]:
    """(zero-shot, linear probe) accuracy of one member on the images under `folder`."""
    view = zoo.view(member)
    pairs = labelled_files(folder, zoo.bank.task(task).classes)
    embeddings = embed_probe_files(view.encoder, [path for path, _ in pairs], 64, "readable", False)
    labels = torch.tensor([label for _, label in pairs])
    predicted = (normalise(embeddings.double()) @ view.class_rows[task].T).argmax(dim=1)
    return float((predicted == labels).double().mean()), headroom.linear_probe(embeddings, labels)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    parser.add_argument("--tasks", nargs="+", default=["colour", "size", "shape", "count"])
    args = parser.parse_args()
    zoo = Zoo(args.zoo, split="train")
    with tempfile.TemporaryDirectory() as scratch:
        for task in args.tasks:
            print(
                f"{task}: zero-shot / linear probe (%), mean over members, then per member",
                flush=True,
            )
            for name, style in STYLES.items():
                folder = Path(scratch) / task / name
                draw(folder, task, style)
                figures = {member: read(zoo, member, task, folder) for member in zoo.members}
                zero_shot, probe = (100 * np.mean([f[i] for f in figures.values()]) for i in (0, 1))
                print(
                    f"  {name:<38} {zero_shot:5.1f} / {probe:5.1f}   "
                    + "  ".join(
                        f"{m} {100 * z:.0f}/{100 * p:.0f}" for m, (z, p) in figures.items()
                    ),
                    flush=True,
                )


if __name__ == "__main__":
    main()
