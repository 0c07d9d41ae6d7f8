"""A zoo trial that keeps the members and fine-tunes sources again with other settings or code,
judged by `ptc paper`'s report on the labelled TRAIN split (never test).

The zoo is copied without the named members' sources and descriptors (every member by default;
the pretrained members, the world, the bank's cached grid embeddings and the other members'
sources are kept), those sources are rebuilt by `ptc zoo build`'s own code (with the checkout's
fine-tuning code, and the profile's step count or LoRA dropout replaced by --steps or
--lora-dropout), and the train-split report is written as OUT/NAME-train.{md,json,png}. Compare
it with results/paper-full-train.md.

--train-extra N adds N labelled images per class to every task's train split (drawn from a
stream of their own: probes and test splits stay the committed bytes) for the sources to learn
from. The report is then scored on the larger train split, so its baseline is the control
`--train-extra N --keep-sources`: the committed sources, fine-tuned again on nothing, scored there.

    python3 -m ptc.lab.benchmarks.source_trial [--steps 50] [--lora-dropout 0.1] [--train-extra 80]
                                       [--keep-sources] [--members resnet] [--name NAME]
                                       [--zoo zoo] [--work /tmp/source-trial] [--out results/trials]

About 7 minutes at 50 steps and 22 at 300 for the full zoo's 84 sources on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
import shutil
from pathlib import Path

from ptc import targets
from ptc.compiler.edit.lora import check_lora_dropout
from ptc.errors import InputError
from ptc.files import write_json_atomic
from ptc.lab.zoo import build, paper, report
from ptc.lab.zoo.build import (
    INDEX,
    build_zoo,
    collapsed,
    profile_named,
    read_index,
    world_fields,
    write_world_once,
)
from ptc.lab.zoo.world import check_size

# Not copied, by folder: what the trial does not need (the audio zoo, the pretraining corpus)
# and the operators, solved from descriptors, some of which it rebuilds.
LEFT_OUT = {".": ("audio",), "bank": ("operators",), "world": ("pretrain",)}


def copy_without_sources(zoo: Path, work: Path, members: list[str]) -> None:
    """Copy the zoo, leaving out `members`' sources, their descriptors (`NAME-sSEED` in every
    task's folder) and their source records."""

    def ignored(folder: str, names: list[str]) -> list[str]:
        where = Path(folder).relative_to(zoo)
        skip = set(LEFT_OUT.get(where.as_posix(), ()))
        if where.as_posix() == "sources":
            skip.update(members)
        if where.parent.as_posix() == "bank/descriptors":
            skip.update(name for name in names if name.rsplit("-s", 1)[0] in members)
        return [name for name in names if name in skip]

    shutil.copytree(zoo, work, ignore=ignored)
    index = read_index(work)
    for name in members:
        index["members"][name].pop("sources", None)
    write_json_atomic(work / INDEX, index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/source-trial"))
    parser.add_argument("--out", type=Path, default=Path("results/trials"))
    parser.add_argument(
        "--steps", type=int, help="fine-tuning steps per source (default: the profile's)"
    )
    parser.add_argument(
        "--lora-dropout",
        type=float,
        help="peft's lora_dropout for the sources (default: the profile's)",
    )
    parser.add_argument(
        "--train-extra", type=int, help="labelled images per class added to every train split"
    )
    parser.add_argument(
        "--keep-sources",
        action="store_true",
        help="fine-tune nothing: the committed sources on the changed train split (--train-extra's control)",
    )
    parser.add_argument(
        "--members", nargs="+", help="whose sources to rebuild (default: every member's)"
    )
    parser.add_argument(
        "--name", help="the report's name (default: from the options, e.g. lora-dropout-0.1)"
    )
    args = parser.parse_args()
    index = zoo_index(args.zoo)
    members = args.members or list(index["members"])
    unknown = sorted(set(members) - set(index["members"]))
    if unknown:
        raise SystemExit(
            f"{args.zoo}: no member {', '.join(unknown)} (members: {', '.join(index['members'])})"
        )
    tried = [
        (field, label, value)
        for field, label, value in (
            ("finetune_steps", "finetune-steps", args.steps),
            ("finetune_dropout", "lora-dropout", args.lora_dropout),
        )
        if value is not None
    ]
    if not tried and args.train_extra is None:
        raise SystemExit(
            "nothing to try: name --steps, --lora-dropout, --train-extra or more than one"
        )
    if args.keep_sources and (tried or args.members or args.train_extra is None):
        raise SystemExit(
            "--keep-sources is --train-extra's control: it takes --train-extra alone, "
            "without --steps, --lora-dropout or --members"
        )
    profile = dataclasses.replace(
        profile_named(index["profile"]), **{field: value for field, _, value in tried}
    )
    if args.train_extra is not None:
        profile = dataclasses.replace(
            profile, world=dataclasses.replace(profile.world, train_extra=args.train_extra)
        )
        check_size(profile.world)
    if args.lora_dropout:  # known before any member's sources are fine-tuned, not at one of them
        refuse_dropout_where_unsupported(args.zoo, index, members, args.lora_dropout)
    if args.work.exists():
        raise SystemExit(f"{args.work} exists: remove it, or name another --work")
    copy_without_sources(args.zoo, args.work, [] if args.keep_sources else members)
    labels = [f"{label}-{value:g}" for _, label, value in tried]
    if args.train_extra is not None:
        rewrite_train_splits(args.zoo, args.work, profile)
        labels.append(f"train-extra-{args.train_extra}")
    name = args.name or "-".join(labels) + ("-control" if args.keep_sources else "")
    build_and_report(args.work, profile, args.out, name)


def rewrite_train_splits(zoo: Path, work: Path, profile) -> None:
    """Every task's splits written again for the profile's world (its train splits larger), and
    checked: every file of the committed zoo's splits comes out the same."""
    record_world(work, profile)
    for task in (*profile.tasks, *profile.in_distribution_tasks):
        # ensure_task writes it all again
        shutil.rmtree(work / "world" / "tasks" / task / "train", ignore_errors=True)
    write_world_once(work, profile)
    differ = different_split_files(zoo, work)
    if differ:
        raise SystemExit(
            f"{work}: {len(differ)} task-split files differ from {zoo}'s (first: {differ[0]})"
        )


def record_world(work: Path, profile) -> None:
    """Record the profile's world as the trial zoo's, in its world.json and its index, so that
    `ptc zoo build` writes that world's splits and finishes the zoo under that profile."""
    index = read_index(work)
    index["world"] = world_fields(profile)["world"]
    write_json_atomic(work / "world" / "world.json", index["world"])
    write_json_atomic(work / INDEX, index)


def refuse_dropout_where_unsupported(
    zoo: Path, index: dict, members: list[str], dropout: float
) -> None:
    """Exit naming every member whose LoRA cannot take dropout (it adapts parameters)."""
    refusals = []
    for name in members:
        try:
            check_lora_dropout(targets.load(index["members"][name]["ref"], zoo), dropout)
        except InputError as error:
            refusals.append(error.message)
    if refusals:
        raise SystemExit("; ".join(refusals) + " (name the other members with --members)")


def different_split_files(committed: Path, trial: Path, tasks=None) -> list[str]:
    """Files of the committed zoo's task splits (those it holds; of `tasks` only, if named) that
    the trial's world lacks or writes differently."""
    differ = []
    folders = (
        [committed / "world" / "tasks" / task for task in tasks]
        if tasks is not None
        else [committed / "world" / "tasks"]
    )
    for path in sorted(p for folder in folders for p in folder.rglob("*") if p.is_file()):
        twin = trial / "world" / "tasks" / path.relative_to(committed / "world" / "tasks")
        if not twin.is_file() or not filecmp.cmp(path, twin, shallow=False):
            differ.append(str(path.relative_to(committed)))
    return differ


def zoo_index(zoo: Path) -> dict:
    index = read_index(zoo)
    if not index.get("members"):
        raise SystemExit(f"{zoo}: no built zoo there (no members in {INDEX}); name one with --zoo")
    return index


def build_and_report(work: Path, profile, out: Path, name: str) -> None:
    """Finish the trial zoo with `ptc zoo build`'s code, member by member, and write its
    train-split report. Every trial's criterion needs every member to tell every task's prompts
    apart, so the build stops at the first member that does not (before hours on the others)."""
    for member in profile.members:
        lost = collapsed(build_zoo(work, profile, echo=print, members=(member.name,)))
        if lost:
            raise SystemExit(
                f"{work}: class prompts collapsed (mean cosine over {build.MAX_PROMPT_COSINE}) on "
                f"{', '.join(lost)}: the trial fails its criterion whatever the other members do; "
                "stopped before building them, no report written"
            )
    results = paper.run(work, echo=print, split="train")
    for path in report.write(results, out, f"{name}-train"):
        print(f"written: {path}")
    for line in report.findings(results):
        print(line)


if __name__ == "__main__":
    main()
