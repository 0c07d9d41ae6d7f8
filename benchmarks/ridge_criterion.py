"""Would another way of choosing the ridge transfer more? On the labelled TRAIN split only.

`ptc paper` chooses the ridge by the Oracle's gain on train among the ridges whose Random-UTD stays
within +-1 point there (`paper.choose_ridge`). This prints,
for every candidate in `paper.RIDGES`, the Oracle's and the cross-model closed form's mean gain,
the pooled retention and Random-UTD's gain (a Gaussian descriptor of the Oracle's norm), over
all cells and per target, every seed pooled. A criterion that
picked the ridge with the best retention would reward a weak Oracle as much as a strong
transfer; the cross-model gain is the figure a user of the tool gets.

Then, for whoever decides the rule: negation at lambda 1 (removed and control, first seed) at
each ridge, and the ridge a one-standard-error rule would pick: the largest eligible ridge whose
Oracle is within one standard error of the best eligible one's (the error of the paired
per-cell difference). The rule `ptc paper` uses picks the best one outright, so near-ties (a
few hundredths of a point) decide it.

    python3 -m ptc.lab.benchmarks.ridge_criterion [--zoo zoo]

About 12 s for the full zoo on 2 cores once its bank holds the grid embeddings (`ptc paper` fills them).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from ptc.lab.zoo.paper import (
    RANDOM_UTD_BAR,
    RIDGES,
    Zoo,
    _mean,
    addition_cells,
    negation_sweep,
    retention,
)


def gains(cells: list[dict]) -> str:
    return (
        f"Oracle {_mean(c['oracle_gain'] for c in cells):+6.2f}  "
        f"cross {_mean(c['cross_model_gain'] for c in cells):+6.2f}  retention {retention(cells):6.3f}  "
        f"Random-UTD {_mean(c['random_utd_gain'] for c in cells):+6.2f}"
    )


def one_standard_error_choice(
    oracle: dict[float, list[float]], random_utd: dict[float, float]
) -> float:
    """The largest ridge, among those whose Random-UTD is within its bar, whose Oracle gain is
    within one standard error of the best such ridge's. `oracle` holds per-cell gains in one
    cell order for every ridge, so the error is the paired difference's."""
    eligible = [r for r in oracle if abs(random_utd[r]) <= RANDOM_UTD_BAR] or list(oracle)
    best = max(eligible, key=lambda r: np.mean(oracle[r]))

    def within(ridge: float) -> bool:
        difference = np.asarray(oracle[best]) - np.asarray(oracle[ridge])
        return difference.mean() <= difference.std(ddof=1) / np.sqrt(len(difference))

    return max(r for r in eligible if within(r))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    args = parser.parse_args()
    zoo = Zoo(args.zoo, split="train")
    oracle, random_utd, negation = {}, {}, {}
    for ridge in RIDGES:
        zoo.use_ridge(ridge)
        cells = [cell for seed in zoo.seeds for cell in addition_cells(zoo, seed)]
        print(f"ridge {ridge:g}: all cells: {gains(cells)}", flush=True)
        for target in zoo.members:
            print(
                f"    target {target:8s} {gains([c for c in cells if c['target'] == target])}",
                flush=True,
            )
        # One Oracle gain per (target, task, seed): addition cells repeat it once per source.
        own = {(c["target"], c["task"], c["seed"]): c["oracle_gain"] for c in cells}
        oracle[ridge] = [own[key] for key in sorted(own)]
        random_utd[ridge] = _mean(c["random_utd_gain"] for c in cells)
        negation[ridge] = negation_sweep(zoo, zoo.seeds[0])["lambda_1"]
    print(
        "negation at lambda 1 (first seed), removed / control: "
        + ", ".join(
            f"{r:g}: {negation[r]['removed_delta']:+.2f} / {negation[r]['control_delta']:+.2f}"
            for r in RIDGES
        )
    )
    print(f"one-standard-error rule would pick: {one_standard_error_choice(oracle, random_utd):g}")


if __name__ == "__main__":
    main()
