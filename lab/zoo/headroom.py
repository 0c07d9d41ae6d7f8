"""Why the Oracle recovers little of a fine-tune's gain, for `ptc paper`'s report. Measured on
the labelled train split (never test), per target and task, with the target's own descriptor.

The closed form adds a linear function of the target's pre-trained embedding to its
affinities, so its gain is bounded by what the fine-tune changed and by what that embedding
encodes linearly. Each row puts the Oracle beside those bounds:

- half step: the fine-tune's affinity change at half strength, reproduced exactly (argmax of
  S_pre + 0.5 (S_ft - S_pre)): what an edit that reproduced the fine-tune's own change on these
  inputs would score at the paper's alpha (in-sample, like the fine-tune's accuracy here: the
  sources were trained on this split);
- linear probe: a labelled logistic regression on the target's normalised pre-trained
  embeddings, cross-validated on the split: what a linear read-out learns from its labels
  (not a bound on the Oracle, whose edit is fitted without the split's labels, but one it
  rarely beats here);
- explained: the share of the row-centred descriptor that the solve's first-order descriptor
  reproduces on the probes it was fitted on, and on probes held out of the fit (two halves,
  each scored by the other's solve);
- class-bias share: the share of the row-centred descriptor that is one offset per class for
  every probe (a fine-tune that mostly re-balances its classes moves little that separates them).
"""

from __future__ import annotations

import numpy as np
import torch

from ptc.compiler.method.descriptor import centred, normalise
from ptc.compiler.embed import embed_probe_files
from ptc.compiler.tasks.labelled import labelled_files
from ptc.compiler.method.ridge import factorize, first_order_descriptor, solve_operator

FOLDS = 5          # linear probe: stratified folds (fewer where a class has fewer examples)
PROBE_C = 10.0     # a weak L2 penalty (sklearn's default is 1): unit-norm inputs need large weights
HALF = 0.5

COLUMNS = ("zero_shot", "finetuned", "half_step", "linear_probe", "oracle_half", "oracle_full",
           "explained_fitted", "explained_held_out", "class_bias_share")


def explained(predicted: torch.Tensor, descriptor: torch.Tensor) -> float:
    """1 - residual / total on row-centred descriptors (what can change a prediction)."""
    target = centred(descriptor.double())
    total = float(target.square().sum())
    return 1 - float((target - centred(predicted.double())).square().sum()) / total if total > 0 else float("nan")


def class_bias_share(descriptor: torch.Tensor) -> float:
    """Share of the row-centred descriptor's energy in its column means (one offset per class)."""
    rows = centred(descriptor.double())
    total = float(rows.square().sum())
    return float(rows.mean(dim=0).square().sum()) * rows.shape[0] / total if total > 0 else float("nan")


def held_out_explained(grid, descriptor: torch.Tensor, ridge: float, seed: int = 0) -> float:
    """Fit the solve on one random half of the probes, score the other half; both ways, averaged."""
    order = torch.randperm(descriptor.shape[0], generator=torch.Generator().manual_seed(seed))
    halves = order[: len(order) // 2], order[len(order) // 2:]
    regressors = (lambda rows: None) if grid.regressors is None else (lambda rows: grid.regressors[rows])
    scores = []
    for fit, held in (halves, halves[::-1]):
        factors = factorize(grid.inputs[fit], grid.class_rows, regressors(fit))
        edit = solve_operator(factors, descriptor[fit], ridge)
        scores.append(explained(first_order_descriptor(grid.inputs[held], grid.class_rows, edit, regressors(held)),
                                descriptor[held]))
    return float(np.mean(scores))


def linear_probe(inputs: torch.Tensor, labels: torch.Tensor) -> float:
    """Cross-validated accuracy of a logistic regression on normalised embeddings."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score

    y = labels.numpy()
    folds = min(FOLDS, int(np.bincount(y).min()))
    if folds < 2:
        return float("nan")
    x = normalise(inputs.double()).numpy()
    model = LogisticRegression(C=PROBE_C, max_iter=2000)
    return float(cross_val_score(model, x, y, cv=StratifiedKFold(folds, shuffle=True, random_state=0)).mean())


def cell(train_zoo, target: str, task: str, seed: int) -> dict:
    """One (target, task) row, accuracies in percent of the train split."""
    view = train_zoo.view(target)
    split, rows, grid = view.tests[task], view.class_rows[task], view.grids[task]
    files = [path for path, _ in labelled_files(train_zoo.test_dir(task), train_zoo.bank.task(task).classes)]
    tuned = view.encoder.with_adapter(train_zoo.adapter(target, task, seed))
    before = normalise(split.inputs.double()) @ rows.T
    after = normalise(embed_probe_files(tuned, files, 64, f"fine-tuned {task}", False).double()) @ rows.T

    def accuracy(affinities: torch.Tensor) -> float:
        return 100 * float((affinities.argmax(dim=1) == split.labels).double().mean())

    own = train_zoo.descriptor(task, target, seed)
    full = view.operator(task, own, 1.0)  # the solve is linear: the 0.5 edit is half of it
    fitted = first_order_descriptor(grid.inputs, grid.class_rows, full, grid.regressors)
    return {"target": target, "task": task, "zero_shot": accuracy(before), "finetuned": accuracy(after),
            "half_step": accuracy(before + HALF * (after - before)),
            "linear_probe": 100 * linear_probe(split.inputs, split.labels),
            "oracle_half": 100 * view.accuracy(task, HALF * full),
            "oracle_full": 100 * view.accuracy(task, full),
            "explained_fitted": explained(fitted, own),
            "explained_held_out": held_out_explained(grid, own, view.ridge, seed),
            "class_bias_share": class_bias_share(own)}


def _means(rows: list[dict]) -> dict:
    return {key: float(np.nanmean([row[key] for row in rows])) for key in COLUMNS}


def run(train_zoo, seed: int) -> dict:
    """Every (target, source task) of the zoo at `seed`, with means per task, per target and overall."""
    if train_zoo.split_name != "train":
        raise ValueError("the Oracle's headroom is measured on the train split, never on test")
    cells = [cell(train_zoo, target, task, seed) for target in train_zoo.members for task in train_zoo.source_tasks]
    return {"seed": seed, "split": "train", "ridge": train_zoo.ridge, "cells": cells,
            "per_task": {task: _means([c for c in cells if c["task"] == task]) for task in train_zoo.source_tasks},
            "per_target": {m: _means([c for c in cells if c["target"] == m]) for m in train_zoo.members},
            "mean": _means(cells)}
