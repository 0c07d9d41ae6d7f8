"""A zoo trial that rebuilds every member on a larger pretraining corpus (same scenes' kind, same
steps, more distinct captioned images), judged by `ptc paper`'s report on the labelled TRAIN
split (never test).

Why a whole rebuild: one-member changes (longer, wider) moved that member between giving and
taking and left the pooled retention where it was. More shared data is a lever that acts on every
member at once, and one the issue names as fair. At 12,000 images and 6,000 steps of 128 a member
sees each image 64 times; the corpus size changes how often, not how long it trains.

The task splits come from streams of their own, so the trial's probes, train and test splits are
byte for byte the committed zoo's (checked before anything trains). The build is `ptc zoo
build`'s own code and resumable: run the same command again to continue.

    python3 -m benchmarks.corpus_trial --pretrain 48000 --work DIR [--zoo zoo] [--out results/trials]

On 2 cores: about 2 hours 20 minutes (pretraining as long as the committed zoo's, plus loading
four times as many images).
"""

from __future__ import annotations

import argparse
import dataclasses
import filecmp
from pathlib import Path

from compiler.fsio import write_json_atomic
from compiler.zoo.build import build_zoo, profile_named, world_fields
from compiler.zoo.worlds import ensure_task, world_module

from .source_trial import build_and_report, zoo_index


def different_split_files(committed: Path, trial: Path) -> list[str]:
    """Files of the committed zoo's task splits (those it holds) that the trial's world lacks or
    writes differently."""
    differ = []
    for path in sorted(p for p in (committed / "world" / "tasks").rglob("*") if p.is_file()):
        twin = trial / "world" / "tasks" / path.relative_to(committed / "world" / "tasks")
        if not twin.is_file() or not filecmp.cmp(path, twin, shallow=False):
            differ.append(str(path.relative_to(committed)))
    return differ


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"), help="the committed zoo, for its profile and splits")
    parser.add_argument("--work", type=Path, required=True, help="where the trial zoo is built (or continued)")
    parser.add_argument("--out", type=Path, default=Path("results/trials"))
    parser.add_argument("--pretrain", type=int, required=True, help="captioned pretraining images")
    args = parser.parse_args()
    base = profile_named(zoo_index(args.zoo)["profile"])
    profile = dataclasses.replace(base, world=dataclasses.replace(base.world, pretrain=args.pretrain))
    world_record = args.work / "world" / "world.json"
    if not world_record.is_file():  # written as build_zoo writes it, so the build goes on from here
        world_module(profile.world_kind).write_world(args.work / "world", profile.world, profile.seed,
                                                     profile.template_share)
        write_json_atomic(world_record, world_fields(profile)["world"])
    for task in (*profile.tasks, *profile.in_distribution_tasks):  # the variants write_world leaves out
        ensure_task(args.work / "world", profile.world_kind, profile.world, profile.seed, task)
    differ = different_split_files(args.zoo, args.work)
    if differ:
        raise SystemExit(f"{args.work}: {len(differ)} task-split files differ from {args.zoo}'s "
                         f"(first: {differ[0]}); the trial must score on the committed splits")
    print(f"task splits: the same bytes as {args.zoo}'s; world {world_fields(profile)['world']}")
    build_and_report(args.work, profile, args.out, f"corpus-{args.pretrain}")


if __name__ == "__main__":
    main()
