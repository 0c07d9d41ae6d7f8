"""Where the cross-model residual reaches the edit: the paper's Table 8 (§C.4), for `ptc paper`.

A source's descriptor of a task differs from the target's own by a model-specific residual.
What transfer forfeits depends on how much of that residual the target's solve lets through.
Per cross-model cell (target, task, source) this compares the source's quantity with the one
from the target's own descriptor, at three places:

- descriptors: the two N x M descriptors on the task's grid;
- operators: the two solved edits of the target;
- shift fields: what each edit does to the target's probe embeddings (z' - z, N x d).

Per place: the mean cosine; its rank correlation with the share of the Oracle's gain the cell
forfeits (over cells whose Oracle gains at least MIN_ORACLE points, the paper's Table 14 rule);
and in how many (target, task) the source that agrees most is the one that transfers most.
Amplification is how much the solve enlarges the residual: its relative size after the solve
over its relative size before.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.stats import spearmanr

from ptc.compiler.method.descriptor import cosine
from ptc.compiler.method.ridge import edited_embeddings

PLACES = ("descriptor", "operator", "shift_field")
MIN_ORACLE = 3.0  # points; below it the forfeited share is dominated by noise (paper, Table 14)

# Table 8 and §C.4: mean agreement, rank correlation with what transfer costs, best source
# identified (of 32 target-task pairs), and the solve's median amplification of the residual.
PAPER = {"descriptor": {"agreement": 0.59, "rank_correlation": -0.26, "best_source": "10 of 32"},
         "operator": {"agreement": 0.39, "rank_correlation": -0.62, "best_source": "9 of 32"},
         "shift_field": {"agreement": 0.43, "rank_correlation": -0.59, "best_source": "9 of 32"},
         "amplification": 1.5}


def shift_field(grid, edit: torch.Tensor) -> torch.Tensor:
    """What an edit does to the target's probe embeddings (N x d, float64)."""
    return edited_embeddings(grid.inputs, grid.regressors, edit) - grid.inputs.double()


def cells(zoo, seed: int, alpha: float) -> list[dict]:
    """One row per cross-model cell: agreement with the target's own at each place, and gains."""
    rows = []
    for target in zoo.members:
        view = zoo.view(target)
        for task in zoo.source_tasks:
            grid, base = view.grids[task], view.accuracy(task)
            own = zoo.descriptor(task, target, seed)
            own_edit = view.operator(task, own, alpha)
            own_field = shift_field(grid, own_edit)
            oracle_gain = 100 * (view.accuracy(task, own_edit) - base)
            for source in zoo.members:
                if source == target:
                    continue
                utd = zoo.descriptor(task, source, seed)
                edit = view.operator(task, utd, alpha)
                rows.append({"target": target, "task": task, "source": source,
                             "descriptor": cosine(utd, own), "operator": cosine(edit, own_edit),
                             "shift_field": cosine(shift_field(grid, edit), own_field),
                             "amplification": float(((edit - own_edit).norm() / own_edit.norm())
                                                    / ((utd - own).norm() / own.norm())),
                             "gain": 100 * (view.accuracy(task, edit) - base), "oracle_gain": oracle_gain})
    return rows


def best_source_identified(rows: list[dict], place: str) -> tuple[int, int]:
    """(hits, pairs): in how many (target, task) the most agreeing source transfers most."""
    pairs = sorted({(r["target"], r["task"]) for r in rows})
    hits = 0
    for pair in pairs:
        mine = [r for r in rows if (r["target"], r["task"]) == pair]
        hits += max(mine, key=lambda r: r[place])["source"] == max(mine, key=lambda r: r["gain"])["source"]
    return hits, len(pairs)


def summarise(rows: list[dict]) -> dict:
    """Table 8's columns from the cells: mean agreement, rank correlation with the forfeited
    share, best source identified, and the median amplification."""
    scored = [r for r in rows if r["oracle_gain"] >= MIN_ORACLE]
    forfeited = [1 - r["gain"] / r["oracle_gain"] for r in scored]
    places = {}
    for place in PLACES:
        hits, pairs = best_source_identified(rows, place)
        # A constant column (a tiny zoo's one source per cell) has no rank correlation: NaN.
        correlation = (float(spearmanr([r[place] for r in scored], forfeited).statistic)
                       if len(scored) > 2 and len({r[place] for r in scored}) > 1 else float("nan"))
        places[place] = {"agreement": float(np.mean([r[place] for r in rows])), "rank_correlation": correlation,
                         "best_source_hits": hits, "pairs": pairs}
    return {"cells": len(rows), "scored_cells": len(scored), **places,
            "amplification": float(np.median([r["amplification"] for r in rows]))}


def run(zoo, seed: int, alpha: float) -> dict:
    rows = cells(zoo, seed, alpha)
    return {"seed": seed, "alpha": alpha, **summarise(rows), "rows": rows}
