"""Is different-task agreement the one shared style shift's correction? On the labelled TRAIN
split's sources (seed 0) only.

A member's fine-tune on one task, read on another attribute's grid, against the member's own
descriptor of that grid (row-centred cosine, as `ptc paper`'s agreement): once on the attribute's
shifted grid, once on its plain-style variant (colour-plain, count-plain, quadrant-plain). If the
fine-tunes of different tasks agree only where both grids carry the shift, what they share is
the shift's correction, not anything about their tasks.

    python3 -m ptc.lab.benchmarks.shift_agreement [--zoo zoo]

About 40 s for the full zoo on 2 cores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ptc.compiler.method.descriptor import centred, cosine
from ptc.lab.zoo.paper import Zoo, _mean, descriptor_on_grid
from ptc.lab.zoo.world import IN_DISTRIBUTION


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    args = parser.parse_args()
    zoo = Zoo(args.zoo, split="train")
    plain_of = {
        shifted: plain for plain, shifted in IN_DISTRIBUTION.items() if plain in zoo.in_distribution
    }
    cosines = {"shifted": [], "plain": []}
    for member in zoo.members:
        encoder = zoo.view(member).encoder
        for task in zoo.source_tasks:
            tuned = encoder.with_adapter(zoo.adapter(member, task, 0))
            for shifted, plain in plain_of.items():
                if shifted == task:
                    continue
                for kind, grid in (("shifted", shifted), ("plain", plain)):
                    crossed = descriptor_on_grid(zoo, member, tuned, grid)
                    cosines[kind].append(
                        float(cosine(centred(crossed), centred(zoo.descriptor(grid, member, 0))))
                    )
    for kind, values in cosines.items():
        print(
            f"fine-tune on another task, read on the {kind:7s} grid: row-centred cosine {_mean(values):+.3f} "
            f"({len(values)} pairs)"
        )


if __name__ == "__main__":
    main()
