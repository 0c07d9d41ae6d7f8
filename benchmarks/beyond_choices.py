"""The defaults of ptc's additions to the paper, each chosen on the zoo's labelled TRAIN split
(never test) by the experiment printed here:

- the relative descriptor's statistics (whole grid, per class or per probe): retention;
- the consensus rule (mean, normalised, median) over all other members: retention;
- the consensus weights (uniform; each source's agreement with the target, as shipped; each
  source's agreement with the other sources' consensus), against the best single source per
  target picked with hindsight on this split: retention;
- `strength: auto`'s control_weight: net points (composed gain + control delta) over J.

    python3 -m ptc.lab.benchmarks.beyond_choices [--zoo zoo]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ptc.compiler.method.descriptor import (
    affinity,
    agreement_weights,
    centred,
    consensus,
    cosine,
    relative_descriptor,
)
from ptc.compiler.recipe.schema import Strength
from ptc.lab.zoo import beyond
from ptc.lab.zoo.paper import ALPHA, Zoo, _points, choose_ridge


def _standardised(utd, source, target, dim):
    """The relative descriptor with statistics over `dim` (None: the whole grid, as shipped)."""
    if dim is None:
        return relative_descriptor(utd, source, target)
    s, t = source.double(), target.double()
    mean = lambda x: x.mean(dim=dim, keepdim=True)  # noqa: E731
    std = lambda x: x.std(dim=dim, keepdim=True)  # noqa: E731
    return mean(t) + std(t) * (utd.double() + s - mean(s)) / std(s) - t


def relative_statistics(zoo: Zoo, seed: int = 0) -> dict:
    rows = {}
    for name, dim in (("grid", None), ("per class", 0), ("per probe", 1)):
        gains, oracle = [], []
        for target in zoo.members:
            view = zoo.view(target)
            for task in zoo.source_tasks:
                base = view.accuracy(task)
                own = _points(
                    view.accuracy(
                        task, view.operator(task, zoo.descriptor(task, target, seed), ALPHA)
                    ),
                    base,
                )
                grid = view.grids[task]
                t_pre = affinity(grid.inputs.double(), grid.class_rows.double())
                for source in zoo.members:
                    if source == target:
                        continue
                    entry = zoo.bank.descriptor(task, f"{source}-s{seed}")
                    u = _standardised(
                        entry.tensors["utd"], entry.tensors["source_affinity"], t_pre, dim
                    )
                    gains.append(_points(view.accuracy(task, view.operator(task, u, ALPHA)), base))
                    oracle.append(own)
        rows[name] = sum(gains) / sum(oracle)
    return rows


def source_weighting(zoo: Zoo) -> dict:
    """Retention of the all-others consensus (normalised rule) under each weighting, over seeds."""
    rows = {}
    for seed in zoo.seeds:
        reader = beyond.Descriptors(zoo, seed)
        for target in zoo.members:
            view, others = zoo.view(target), [m for m in zoo.members if m != target]
            for task in zoo.source_tasks:
                base = view.accuracy(task)
                gain = lambda u: _points(view.accuracy(task, view.operator(task, u, ALPHA)), base)  # noqa: E731
                oracle = gain(reader.paper(task, target, target))
                t_pre = reader.pre_affinity(target, task)
                for kind in ("difference", "relative"):
                    us = [reader.of(kind)(task, s, target) for s in others]
                    weights = {
                        "uniform": None,
                        "agreement": agreement_weights(
                            [reader.pre_affinity(s, task) for s in others], t_pre
                        ),
                        "agreement with the others": [
                            max(cosine(centred(u), centred(sum(v for v in us if v is not u))), 1e-3)
                            for u in us
                        ],
                    }
                    for name, w in weights.items():
                        row = rows.setdefault(kind, {}).setdefault(name, [0.0, 0.0])
                        row[0] += gain(consensus(us, w, "normalised"))
                        row[1] += oracle
                    # for the best single source per target, in hindsight
                    for s, u in zip(others, us):
                        row = rows[kind].setdefault(("single", target, s), [0.0, 0.0])
                        row[0] += gain(u)
                        row[1] += oracle
    out = {}
    for kind, table in rows.items():
        out[kind] = {
            name: round(g / o, 3) for name, (g, o) in table.items() if isinstance(name, str)
        }
        best = [
            max(
                (v for k, v in table.items() if isinstance(k, tuple) and k[1] == t),
                key=lambda v: v[0],
            )
            for t in zoo.members
        ]
        out[kind]["best single source per target (hindsight)"] = round(
            sum(g for g, _ in best) / sum(o for _, o in best), 3
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    args = parser.parse_args()
    zoo = Zoo(args.zoo, split="train")
    zoo.use_ridge(choose_ridge(zoo)["ridge"])  # ptc paper's ridge, chosen on the same split
    print(
        "relative descriptor statistics, retention (seed 0):",
        {k: round(v, 3) for k, v in relative_statistics(zoo).items()},
    )
    everyone = str(len(zoo.members) - 1)
    for kind in ("difference", "relative"):
        per_seed = [
            beyond.summarise_sources(beyond.source_cells(zoo, seed), zoo)[kind]
            for seed in zoo.seeds
        ]
        print(
            f"consensus of all other members ({kind}), retention by rule:",
            {
                rule: round(
                    sum(s["retention_by_rule"][rule][everyone] for s in per_seed) / len(per_seed), 3
                )
                for rule in ("mean", "normalised", "median")
            },
        )
    for kind, table in source_weighting(zoo).items():
        print(
            f"consensus weights, all other members, normalised rule ({kind}), retention over seeds:",
            table,
        )
    for weight in (0.25, 0.5, 1.0, 2.0, 4.0, 8.0):
        nets = {}
        for kind in ("difference", "relative"):
            rows = beyond.strength_rows(zoo, 0, kind, Strength(mode="auto", control_weight=weight))
            nets[kind] = round(
                sum(r["auto"]["composed_gain"] + r["auto"]["control_delta"] for r in rows.values())
                / len(rows),
                2,
            )
        print(
            f"strength auto, control_weight {weight:g}: net points over J = 1..{len(rows)}: {nets}"
        )


if __name__ == "__main__":
    main()
