"""Would another way of choosing the ridge transfer more? On the labelled TRAIN split only.

`ptc paper` chooses the ridge by the Oracle's gain on train among the ridges whose Random-UTD stays
within +-1 point there (`paper.choose_ridge`). This prints,
for every candidate in `paper.RIDGES`, the Oracle's and the cross-model closed form's mean gain,
the pooled retention and Random-UTD's gain (a Gaussian descriptor of the Oracle's norm), over
all cells and per target, every seed pooled. A criterion that
picked the ridge with the best retention would reward a weak Oracle as much as a strong
transfer; the cross-model gain is the figure a user of the tool gets.

    python3 -m benchmarks.ridge_criterion [--zoo zoo]

About 12 s for the full zoo on 2 cores once its bank holds the grid embeddings (`ptc paper` fills them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from compiler.zoo.paper import RIDGES, Zoo, _mean, addition_cells, retention


def gains(cells: list[dict]) -> str:
    return (f"Oracle {_mean(c['oracle_gain'] for c in cells):+6.2f}  "
            f"cross {_mean(c['cross_model_gain'] for c in cells):+6.2f}  retention {retention(cells):6.3f}  "
            f"Random-UTD {_mean(c['random_utd_gain'] for c in cells):+6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    args = parser.parse_args()
    zoo = Zoo(args.zoo, split="train")
    for ridge in RIDGES:
        zoo.use_ridge(ridge)
        cells = [cell for seed in zoo.seeds for cell in addition_cells(zoo, seed)]
        print(f"ridge {ridge:g}: all cells: {gains(cells)}", flush=True)
        for target in zoo.members:
            print(f"    target {target:8s} {gains([c for c in cells if c['target'] == target])}", flush=True)


if __name__ == "__main__":
    main()
