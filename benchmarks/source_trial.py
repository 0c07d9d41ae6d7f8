"""A zoo trial that keeps the members and fine-tunes every source again with other settings,
judged by `ptc paper`'s report on the labelled TRAIN split (never test).

The zoo is copied without its sources and descriptors (the pretrained members, the world and
the bank's cached grid embeddings are kept), its sources are rebuilt by `ptc zoo build`'s own
code with the profile's fine-tuning settings replaced, and the train-split report is written as
OUT/NAME-train.{md,json,png}. Compare it with results/paper-full-train.md.

    python3 -m benchmarks.source_trial --steps 50 [--zoo zoo] [--work /tmp/source-trial] [--out results/trials]

About 7 minutes at 50 steps and 22 at 300 for the full zoo's 84 sources on 2 cores.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
from pathlib import Path

from compiler.fsio import write_json_atomic
from compiler.zoo import paper, report
from compiler.zoo.build import INDEX, build_zoo, profile_named, read_index

# Not copied, by folder: what the trial rebuilds (sources, descriptors and the operators solved
# from them), and what it does not need (the audio zoo, the pretraining corpus).
LEFT_OUT = {".": ("sources", "audio"), "bank": ("descriptors", "operators"), "world": ("pretrain",)}


def copy_without_sources(zoo: Path, work: Path) -> None:
    def ignored(folder: str, names: list[str]) -> list[str]:
        skip = LEFT_OUT.get(Path(folder).relative_to(zoo).as_posix(), ())
        return [name for name in names if name in skip]

    shutil.copytree(zoo, work, ignore=ignored)
    index = read_index(work)
    for record in index["members"].values():
        record.pop("sources", None)
    write_json_atomic(work / INDEX, index)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/source-trial"))
    parser.add_argument("--out", type=Path, default=Path("results/trials"))
    parser.add_argument("--steps", type=int, required=True, help="fine-tuning steps per source")
    args = parser.parse_args()
    index = read_index(args.zoo)
    profile = dataclasses.replace(profile_named(index["profile"]), finetune_steps=args.steps)
    if args.work.exists():
        raise SystemExit(f"{args.work} exists: remove it, or name another --work")
    copy_without_sources(args.zoo, args.work)
    build_zoo(args.work, profile, echo=print)
    results = paper.run(args.work, echo=print, split="train")
    for path in report.write(results, args.out, f"finetune-steps-{args.steps}-train"):
        print(f"written: {path}")
    for line in report.findings(results):
        print(line)


if __name__ == "__main__":
    main()
