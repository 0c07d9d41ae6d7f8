"""Would more probes per task help the closed form? Measured on the zoo's labelled TRAIN split
(never test), first seed, without touching the zoo.

`ptc paper`'s headroom table shows the solve reproducing much less of a descriptor on probes
held out of its fit than on its own, which is what too few probes would look like. This draws
EXTRA more probes per task in the task's shifted style, from a random stream of their own (the
world's probes, train and test splits stay as they are), writes them to a scratch folder,
recomputes every member's descriptors on the larger grid from its committed sources, and
prints the Oracle gain, the cross-model gain and retention with the world's probes and with
the larger grid, at three ridges.

    python3 -m ptc.lab.benchmarks.probe_count [--zoo zoo] [--extra 1200]
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from ptc.compiler.embed import embed_probe_files, embed_probe_files_for_edit
from ptc.compiler.method.descriptor import task_descriptor
from ptc.compiler.method.ridge import factorize, solve_operator
from ptc.lab.zoo import world
from ptc.lab.zoo.paper import ALPHA, Zoo, _mean, _points, retention

RIDGES = (1e-2, 1e-3, 1e-4)


def extra_probes(folder: Path, task: str, count: int, seed: int, shift: str) -> list[Path]:
    """`count` unlabelled probes in the task's style, from a stream no world split draws from."""
    images, targets = world._digit_images()
    fit_pool, _ = world.digit_pools(images)
    rng, paths = random.Random(f"{seed}/{task}/extra-probes"), []
    for i in range(count):
        scene = world.sample_scene(rng, fit_pool, targets)
        path = folder / task / f"{i:05d}.png"
        world.draw_scene(scene, path, rng, images, world.task_style(task, shift))
        paths.append(path)
    return paths


def larger_grids(zoo: Zoo, folder: Path, extra: int, seed: int) -> tuple[dict, dict]:
    """Factors and descriptors of every (member, source task) on the world's probes plus `extra`."""
    shift = zoo.index["world"]["downstream_shift"]
    probes = {
        task: [
            *zoo.bank.task(task).probes,
            *extra_probes(folder, task, extra, zoo.index["seed"], shift),
        ]
        for task in zoo.source_tasks
    }
    factors, descriptors = {}, {}
    for member in zoo.members:
        view = zoo.view(member)
        for task in zoo.source_tasks:
            inputs, regressors = embed_probe_files_for_edit(
                view.encoder, probes[task], 64, "probes", False
            )
            factors[member, task] = factorize(inputs, view.class_rows[task], regressors)
            tuned = view.encoder.with_adapter(zoo.adapter(member, task, seed))
            moved = embed_probe_files(tuned, probes[task], 64, "fine-tuned probes", False)
            descriptors[member, task] = task_descriptor(moved, inputs, view.class_rows[task])
        print(
            f"  {member}: descriptors on {len(probes[zoo.source_tasks[0]])} probes per task",
            flush=True,
        )
    return factors, descriptors


def score(zoo: Zoo, factors, descriptors, ridge: float) -> dict:
    """`ptc paper`'s addition figures (mean gains, pooled retention) for the given grids."""
    oracle, cells = [], []
    for target in zoo.members:
        view = zoo.view(target)
        for task in zoo.source_tasks:
            base = view.accuracy(task)

            def gain(source):
                return _points(
                    view.accuracy(
                        task,
                        solve_operator(  # noqa: E731
                            factors(target, task), ALPHA * descriptors(source, task), ridge
                        ),
                    ),
                    base,
                )

            oracle.append(gain(target))
            cells += [
                {"cross_model_gain": gain(source), "oracle_gain": oracle[-1]}
                for source in zoo.members
                if source != target
            ]
    return {
        "oracle_gain": _mean(oracle),
        "cross_model_gain": _mean(c["cross_model_gain"] for c in cells),
        "retention": retention(cells),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    parser.add_argument("--extra", type=int, default=1200)
    args = parser.parse_args()
    zoo = Zoo(args.zoo, split="train")
    seed = zoo.seeds[0]
    with tempfile.TemporaryDirectory() as scratch:
        factors, descriptors = larger_grids(zoo, Path(scratch), args.extra, seed)
    grids = {
        "world's probes": (
            lambda m, t: zoo.view(m).factors[t],
            lambda m, t: zoo.descriptor(t, m, seed),
        ),
        f"+{args.extra} probes": (lambda m, t: factors[m, t], lambda m, t: descriptors[m, t]),
    }
    for name, (factors_of, descriptor_of) in grids.items():
        for ridge in RIDGES:
            row = score(zoo, factors_of, descriptor_of, ridge)
            print(
                f"{name}, ridge {ridge:g}: Oracle {row['oracle_gain']:+.2f}, cross-model {row['cross_model_gain']:+.2f}, "
                f"retention {row['retention']:.3f} (train split, seed {seed})"
            )


if __name__ == "__main__":
    main()
