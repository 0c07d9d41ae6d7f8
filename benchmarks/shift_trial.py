"""A zoo trial that keeps the pretrained members and draws the downstream tasks in another
shift (`WorldSize.downstream_shift`: "per-task", a shift of each task's own, or "false-colour",
colour alone through a false-colour sensor), judged on the labelled TRAIN split only.

The zoo is copied with its members alone (no task splits, sources, bank or quality figures:
all of them depend on the splits). `ptc zoo build`'s own code writes the task splits in their
per-task shifts, measures the members on them, fine-tunes every source and fills the bank;
then the train-split report is written as OUT/NAME-train.{md,json,png}. Compare it with
results/paper-full-train.md. Run again with the same --work, it goes on where it stopped.

Before any source, the members' zero-shot accuracy on each new task's train split is printed,
and the trial stops if a style fails its requirement (`unfit_styles`; `--check-only` stops
there in any case).

    python3 -m ptc.lab.benchmarks.shift_trial [--shift per-task|false-colour] [--check-only] [--zoo zoo]
                                      [--work /tmp/shift-trial] [--out results/trials] [--name SHIFT-shift]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.tasks.grid import load_task
from ptc.compiler.verify.evaluate import zero_shot_accuracy
from ptc.files import write_json_atomic
from ptc.lab.benchmarks.source_trial import (
    build_and_report,
    different_split_files,
    record_world,
    zoo_index,
)
from ptc.lab.zoo.build import INDEX, profile_named, read_index, world_fields, write_world_once
from ptc.lab.zoo.world import DOWNSTREAM_SHIFTS, attribute_of, task_style

AT_CHANCE = 0.02  # zero-shot within 2 points of chance reads a task not at all
# read within 5 points of the plain style, or above 0.85: no shift
AS_PLAIN, NO_HEADROOM = (
    0.05,
    0.85,
)
# What the copy leaves out, by folder: everything drawn from the task splits, and what the trial
# does not need (the audio zoo, the pretraining corpus).
LEFT_OUT = {".": ("audio", "bank", "sources"), "world": ("pretrain", "tasks")}


def copy_members(zoo: Path, work: Path, profile) -> None:
    """The zoo's members and index, its world recorded as the trial profile's."""

    def ignored(folder: str, names: list[str]) -> list[str]:
        skip = LEFT_OUT.get(Path(folder).relative_to(zoo).as_posix(), ())
        return [name for name in names if name in skip]

    shutil.copytree(zoo, work, ignore=ignored)
    index = read_index(work)
    for record in index["members"].values():
        record.pop("sources", None)
        record.pop("quality", None)
    write_json_atomic(work / INDEX, index)
    record_world(work, profile)


def check_unchanged_splits(zoo: Path, work: Path, profile) -> None:
    """Exit unless every task the trial's shift draws as the shared one does came out as the
    committed zoo's, byte for byte: only the shifted tasks differ."""
    shift = profile.world.downstream_shift
    kept = [
        t
        for t in (*profile.tasks, *profile.in_distribution_tasks)
        if task_style(t, shift) == task_style(t)
    ]
    differ = different_split_files(zoo, work, kept)
    if differ:
        raise SystemExit(
            f"{work}: {len(differ)} files of tasks the {shift} shift leaves alone differ from "
            f"{zoo}'s (first: {differ[0]})"
        )


def zero_shot_on_train(work: Path, index: dict, names) -> dict[str, dict[str, float]]:
    """task -> member -> zero-shot accuracy on the task's train split (printed as it goes)."""
    bank, table = Bank(work / "bank"), {}
    encoders = {
        member: targets.load(record["ref"], work) for member, record in index["members"].items()
    }
    for name in names:
        task, _ = bank.add_task(load_task(work / "world" / "tasks" / name / "task.yaml"))
        table[name] = {
            member: zero_shot_accuracy(
                encoder, task, work / "world" / "tasks" / name / "train", progress=False
            )["accuracy"]
            for member, encoder in encoders.items()
        }
        print(
            f"  {name:<14} chance {1 / len(task.classes):.3f}  "
            + "  ".join(f"{m} {a:.3f}" for m, a in table[name].items()),
            flush=True,
        )
    return table


def fails_requirement(
    figures: list[float], before: list[float], chance: float, plain: list[float] | None
) -> bool:
    """The trial's requirement on one task's new style (results/trials/README.md), from the
    members' zero-shot accuracies: in the new style, in the shared shift (`before`), and in the
    plain style where the task has a plain variant. It fails if three or more members read it at
    chance where the shared shift was not, or if it is read about as well as the plain style
    (no shift, so no headroom for an edit)."""

    def at_chance(accuracies):
        return sum(a <= chance + AT_CHANCE for a in accuracies) >= 3

    mean = sum(figures) / len(figures)
    no_shift = mean > NO_HEADROOM or (
        plain is not None and mean > sum(plain) / len(plain) - AS_PLAIN
    )
    return (at_chance(figures) and not at_chance(before)) or no_shift


def unfit_styles(work: Path, committed: dict, profile) -> list[str]:
    """The tasks whose new style fails the requirement, measured on the train splits against the
    committed zoo's own (shared-shift, test-split) quality figures."""
    plain_of = {attribute_of(plain): plain for plain in profile.in_distribution_tasks}
    table = zero_shot_on_train(
        work, read_index(work), (*profile.tasks, *profile.in_distribution_tasks)
    )
    members = committed["members"].values()
    return [
        name
        for name in profile.tasks
        if fails_requirement(
            list(table[name].values()),
            [m["quality"][name]["zero_shot"] for m in members],
            next(iter(members))["quality"][name]["chance"],
            list(table[plain_of[name]].values()) if name in plain_of else None,
        )
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/shift-trial"))
    parser.add_argument("--out", type=Path, default=Path("results/trials"))
    parser.add_argument(
        "--shift", default="per-task", choices=[s for s in DOWNSTREAM_SHIFTS if s != "shared"]
    )
    parser.add_argument("--name", help="the report's name (default: SHIFT-shift)")
    parser.add_argument(
        "--check-only", action="store_true", help="stop after the readability check"
    )
    args = parser.parse_args()
    index = zoo_index(args.zoo)
    base = profile_named(index["profile"])
    profile = dataclasses.replace(
        base, world=dataclasses.replace(base.world, downstream_shift=args.shift)
    )
    if not args.work.exists():
        copy_members(args.zoo, args.work, profile)
    elif read_index(args.work).get("world") != world_fields(profile)["world"]:
        raise SystemExit(
            f"{args.work} exists and is not a {args.shift} shift trial: remove it, or name another --work"
        )
    write_world_once(args.work, profile)
    check_unchanged_splits(args.zoo, args.work, profile)
    print("zero-shot on each task's train split:", flush=True)
    unfit = unfit_styles(args.work, index, profile)
    if unfit:
        raise SystemExit(
            f"the style of {', '.join(unfit)} fails the trial's requirement (read at chance, or "
            "as well as the plain style; results/trials/README.md): no sources fine-tuned"
        )
    if not args.check_only:
        build_and_report(args.work, profile, args.out, args.name or f"{args.shift}-shift")


if __name__ == "__main__":
    main()
