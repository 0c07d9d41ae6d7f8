"""A zoo trial that rebuilds every member with one change that acts on all of them at once (a
larger pretraining corpus, longer pretraining, or wider members), judged by `ptc paper`'s report on the
labelled TRAIN split (never test).

Why whole rebuilds: one-member changes (longer, wider) moved that member between giving and
taking and left the pooled retention where it was. The issue's fair levers include shared data
and longer training, and both act on every member at once.

The task splits come from streams of their own, so the trial's probes, train and test splits are
byte for byte the committed zoo's (checked before anything trains). The build is `ptc zoo
build`'s own code and resumable: run the same command again to continue.

    python3 -m ptc.lab.benchmarks.rebuild_trial --work DIR [--pretrain IMAGES] [--longer FACTOR]
                                        [--shapes NAME] [--zoo zoo] [--out results/trials]

--pretrain sets the corpus size (the committed zoo's: 12,000 captioned images); --longer
multiplies every member's pretraining steps; --shapes swaps every member's builder options for
one of SHAPES (a named, reviewable table: a family's width is spelt differently by each builder,
so no single factor could scale them all). On a lent GPU, `benchmarks/device_zoo.sh` runs the
same trial with TRIAL="--longer 1.5" (each member built side by side, then merged and scored).
On 2 cores a rebuild takes about 2 hours at the
committed settings, and about as much longer as the steps are.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from ptc.lab.benchmarks.source_trial import build_and_report, different_split_files, zoo_index
from ptc.lab.zoo.build import build_zoo, profile_named, world_fields, write_world_once
from ptc.lab.zoo.profiles import Profile

# Every member's builder options for a shape trial, the members' whole option sets (not
# changes), so the table reads as the zoo it builds. "wide-1.5": every tower and embedding 1.5
# times as wide (heads and depth kept, so each head is wider), and the two open_clip members on
# the tiny vocabulary, whose 49,408-token tables were 88% of their weights, to stay within the
# 40 MB budget.
SHAPES = {
    "wide-1.5": {
        "clip": {"width": 96, "embed_dim": 96, "layers": 4, "heads": 4, "patch_size": 4},
        "siglip": {"width": 120, "layers": 4, "heads": 4, "patch_size": 4},
        "vit": {
            "width": 96,
            "embed_dim": 72,
            "layers": 4,
            "heads": 4,
            "patch_size": 4,
            "vocab": "tiny",
        },
        "eva": {
            "tower": "ptc_eva02_w96_d4_p4_32",
            "embed_dim": 108,
            "text_width": 96,
            "vocab": "tiny",
        },
    },
}


def changed_profile(
    base: Profile, pretrain: int | None, longer: float, shapes: str | None = None
) -> Profile:
    """`base` with the corpus size, every member's pretraining steps and (by SHAPES name) every
    member's builder options changed."""
    world = base.world if pretrain is None else dataclasses.replace(base.world, pretrain=pretrain)
    options = SHAPES[shapes] if shapes else {m.name: m.options for m in base.members}
    if set(options) != {m.name for m in base.members}:
        raise SystemExit(
            f"shapes {shapes!r} name members {sorted(options)}, the profile has "
            f"{sorted(m.name for m in base.members)}"
        )
    members = tuple(
        dataclasses.replace(
            m,
            options=options[m.name],
            pretrain=m.pretrain
            | {"steps": round(longer * m.pretrain.get("steps", base.pretrain.steps))},
        )
        for m in base.members
    )
    return dataclasses.replace(base, world=world, members=members)


def trial_name(pretrain: int | None, longer: float, shapes: str | None = None) -> str:
    parts = (
        ([f"corpus-{pretrain}"] if pretrain is not None else [])
        + ([f"longer-{longer:g}"] if longer != 1 else [])
        + ([shapes] if shapes else [])
    )
    return "-".join(parts) or "rebuild"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--zoo",
        type=Path,
        default=Path("zoo"),
        help="the committed zoo, for its profile and splits",
    )
    parser.add_argument(
        "--work", type=Path, required=True, help="where the trial zoo is built (or continued)"
    )
    parser.add_argument("--out", type=Path, default=Path("results/trials"))
    parser.add_argument(
        "--pretrain", type=int, help="captioned pretraining images (default: the profile's)"
    )
    parser.add_argument(
        "--longer", type=float, default=1.0, help="every member's pretraining steps times this"
    )
    parser.add_argument(
        "--shapes", choices=sorted(SHAPES), help="every member's builder options, from SHAPES"
    )
    parser.add_argument(
        "--members",
        nargs="+",
        help="build only these, and write no report (device_zoo.sh builds "
        "each member in a zoo of its own, then merges and scores them)",
    )
    args = parser.parse_args()
    profile = changed_profile(
        profile_named(zoo_index(args.zoo)["profile"]), args.pretrain, args.longer, args.shapes
    )
    write_world_once(args.work, profile)
    differ = different_split_files(args.zoo, args.work)
    if differ:
        raise SystemExit(
            f"{args.work}: {len(differ)} task-split files differ from {args.zoo}'s "
            f"(first: {differ[0]}); the trial must score on the committed splits"
        )
    steps = ", ".join(f"{m.name} {m.pretrain['steps']}" for m in profile.members)
    print(
        f"task splits: the same bytes as {args.zoo}'s; world {world_fields(profile)['world']}; steps {steps}"
    )
    if args.shapes:
        print("shapes: " + "; ".join(f"{m.name} {m.options}" for m in profile.members))
    if args.members:
        build_zoo(args.work, profile, echo=print, members=tuple(args.members))
    else:
        build_and_report(
            args.work, profile, args.out, trial_name(args.pretrain, args.longer, args.shapes)
        )


if __name__ == "__main__":
    main()
