"""`ptc paper`'s beyond-the-paper experiments (issue #8), on held-out test splits: consensus
descriptors, target-relative descriptors, label-free strength and the composition certificate.

Every edit goes through the code a recipe runs: descriptor.consensus and relative_descriptor
(terms.py's rules), strength.choose_strengths and certify.certificate. Cells and gains are
as in paper.py: percentage points against the target's zero-shot, retention pooled over cells
(sum of gains over the sum of the paired Oracle gains).
"""

from __future__ import annotations

import itertools

import torch

from ..certify import certificate
from ..descriptor import affinity, consensus, cosine
from ..recipe import Strength, Term
from ..strength import choose_strengths
from ..terms import source_descriptor
from .paper import _mean, _points

ALPHA = 0.5
DEFAULT_RULE = Term.model_fields["combine"].default  # the headline consensus is what a recipe gets


def _retention(gains: list[float], oracle: list[float]) -> float:
    return sum(gains) / sum(oracle) if sum(oracle) > 0 else float("nan")


class Descriptors:
    """A zoo's descriptors of one seed as a target reads them: the paper's or relative."""

    def __init__(self, zoo, seed: int):
        self.zoo, self.seed = zoo, seed

    def pre_affinity(self, member: str, task: str) -> torch.Tensor:
        grid = self.zoo.view(member).grids[task]
        return affinity(grid.inputs.double(), grid.class_rows.double())

    def paper(self, task: str, source: str, target: str) -> torch.Tensor:
        return self.zoo.descriptor(task, source, self.seed)

    def relative(self, task: str, source: str, target: str) -> torch.Tensor:
        entry = self.zoo.bank.descriptor(task, f"{source}-s{self.seed}")
        return source_descriptor(entry, "relative", self.pre_affinity(target, task))

    def of(self, kind: str):
        return self.paper if kind == "difference" else self.relative


# -- 1 and 3: consensus and relative descriptors ---------------------------------------------------
def source_cells(zoo, seed: int, tasks: list[str] | None = None) -> list[dict]:
    """Per (target, task): the Oracle gain, every single cross-model source's gain and the
    consensus of every subset of the other members, for both descriptor kinds."""
    reader, cells = Descriptors(zoo, seed), []
    for target in zoo.members:
        view = zoo.view(target)
        others = [m for m in zoo.members if m != target]
        for task in zoo.source_tasks if tasks is None else tasks:
            base = view.accuracy(task)
            gain = lambda u: _points(view.accuracy(task, view.operator(task, u, ALPHA)), base)  # noqa: E731
            own = reader.paper(task, target, target)
            cell = {"target": target, "task": task, "seed": seed, "oracle_gain": gain(own), "kinds": {}}
            for kind in ("difference", "relative"):
                read = reader.of(kind)
                singles = {s: read(task, s, target) for s in others}
                row = {"single": {s: gain(u) for s, u in singles.items()},
                       "single_cosine_to_own": {s: cosine(u, own) for s, u in singles.items()}, "consensus": {}}
                for n in range(1, len(others) + 1):
                    for subset in itertools.combinations(others, n):
                        parts = [singles[s] for s in subset]
                        for rule in ("mean", "normalised", "median"):
                            u = consensus(parts, combine=rule)
                            row["consensus"].setdefault(rule, {}).setdefault(str(n), []).append(
                                {"sources": list(subset), "gain": gain(u), "cosine_to_own": cosine(u, own)})
                cell["kinds"][kind] = row
            cells.append(cell)
    return cells


def summarise_sources(cells: list[dict], zoo, tasks: list[str] | None = None) -> dict:
    """Retention against the number of sources, best single sources, agreement with the Oracle."""
    everyone = str(len(zoo.members) - 1)
    out = {}
    for kind in ("difference", "relative"):
        oracle_per_single = [c["oracle_gain"] for c in cells for _ in c["kinds"][kind]["single"]]
        singles = [g for c in cells for g in c["kinds"][kind]["single"].values()]
        # Best single source: per target, the member whose transfers gain most over its cells
        # (a hindsight choice on test, so a generous comparison); and per cell (more generous).
        best_fixed, best_cell = [], []
        for target in zoo.members:
            mine = [c for c in cells if c["target"] == target]
            sources = list(mine[0]["kinds"][kind]["single"]) if mine else []
            if sources:
                top = max(sources, key=lambda s: sum(c["kinds"][kind]["single"][s] for c in mine))
                best_fixed += [c["kinds"][kind]["single"][top] for c in mine]
            best_cell += [max(c["kinds"][kind]["single"].values()) for c in mine]
        oracle = [c["oracle_gain"] for c in cells]
        by_count = {"1": _retention(singles, oracle_per_single)}
        rules = {}
        for rule in ("mean", "normalised", "median"):
            rules[rule] = {}
            for n in range(1, len(zoo.members)):
                rows = [(r["gain"], c["oracle_gain"]) for c in cells for r in c["kinds"][kind]["consensus"][rule][str(n)]]
                rules[rule][str(n)] = _retention([g for g, _ in rows], [o for _, o in rows])
        by_count.update(rules[DEFAULT_RULE])
        all_mean = [c["kinds"][kind]["consensus"][DEFAULT_RULE][everyone][0] for c in cells]
        out[kind] = {
            "single_source_retention": by_count["1"],
            "best_fixed_source_retention": _retention(best_fixed, oracle),
            "best_cell_source_retention": _retention(best_cell, oracle),
            "consensus_retention": _retention([r["gain"] for r in all_mean], oracle),
            "retention_by_sources": by_count, "retention_by_rule": rules,
            "single_gain": _mean(singles), "consensus_gain": _mean(r["gain"] for r in all_mean),
            "oracle_gain": _mean(oracle),
            "single_cosine_to_own": _mean(v for c in cells for v in c["kinds"][kind]["single_cosine_to_own"].values()),
            "consensus_cosine_to_own": _mean(r["cosine_to_own"] for r in all_mean),
            "per_task": {task: {"single": _retention(
                [g for c in cells if c["task"] == task for g in c["kinds"][kind]["single"].values()],
                [c["oracle_gain"] for c in cells if c["task"] == task for _ in c["kinds"][kind]["single"]]),
                "consensus": _retention([c["kinds"][kind]["consensus"][DEFAULT_RULE][everyone][0]["gain"]
                                         for c in cells if c["task"] == task],
                                        [c["oracle_gain"] for c in cells if c["task"] == task])}
                for task in (zoo.source_tasks if tasks is None else tasks)},
            "cells": len(cells)}
    return out


# -- 2: label-free strength ------------------------------------------------------------------------
def strength_rows(zoo, seed: int, kind: str = "difference", config: Strength = Strength(mode="auto")) -> dict:
    """Composed gain and control delta at each J for fixed 0.5, 0.5/J and `strength: auto`;
    each window of J consecutive source tasks on every target, sources rotating over the
    other members. Auto's control grids are the bank's other tasks, as in a recipe."""
    reader, rows = Descriptors(zoo, seed), {}
    for j in range(1, len(zoo.source_tasks) + 1):
        scores = {rule: {"gains": [], "controls": [], "weights": []} for rule in ("fixed", "per_task", "auto")}
        for target in zoo.members:
            view = zoo.view(target)
            others = [m for m in zoo.members if m != target]
            for start in range(len(zoo.source_tasks) - j + 1):
                tasks = zoo.source_tasks[start:start + j]
                for shift in range(len(others)):
                    terms = [(t, reader.of(kind)(t, others[(i + shift) % len(others)], target), 1.0)
                             for i, t in enumerate(tasks)]
                    controls = {t: view.grids[t] for t in zoo.tasks if t not in tasks}
                    chosen = choose_strengths(terms, view.grids, controls, zoo.ridge, config)["weights"]
                    for rule, weights in (("fixed", [ALPHA] * j), ("per_task", [ALPHA / j] * j), ("auto", chosen)):
                        edit = sum(w * view.operator(t, u, 1.0) for w, (t, u, _) in zip(weights, terms))
                        scores[rule]["gains"].append(_mean(_points(view.accuracy(t, edit), view.accuracy(t))
                                                           for t in tasks))
                        scores[rule]["controls"].append(_mean(_points(view.accuracy(c, edit), view.accuracy(c))
                                                              for c in zoo.controls))
                        scores[rule]["weights"] += weights
        rows[str(j)] = {rule: {"composed_gain": _mean(s["gains"]), "control_delta": _mean(s["controls"]),
                               "mean_weight": _mean(s["weights"]), "cells": len(s["gains"])}
                        for rule, s in scores.items()}
    return rows


# -- 4: the composition certificate ----------------------------------------------------------------
def certify_cells(zoo, seed: int) -> dict:
    """The certificate of every two-task composition (tasks from two other members, alpha
    each) and of the all-task composition, on each term task's held-out test inputs."""
    reader, records = Descriptors(zoo, seed), []
    for target in zoo.members:
        view = zoo.view(target)
        others = [m for m in zoo.members if m != target]
        compositions = [list(pair) for pair in itertools.combinations(zoo.source_tasks, 2)] + [list(zoo.source_tasks)]
        for tasks in compositions:
            edits = {t: view.operator(t, reader.paper(t, others[i % len(others)], target), ALPHA)
                     for i, t in enumerate(tasks)}
            full = sum(edits.values())
            for task in tasks:
                split = view.tests[task]
                figures = certificate(split.inputs, split.regressors, view.class_rows[task], edits[task], full)
                records.append({"target": target, "tasks": tasks, "task": task, **figures})
    inputs = sum(r["inputs"] for r in records)
    return {"certified_fraction": sum(r["certified"] for r in records) / inputs,
            "certified_changed": sum(r["certified_changed"] for r in records),
            "changed": sum(r["changed"] for r in records), "inputs": inputs, "records": len(records),
            "two_task_certified_fraction": _fraction([r for r in records if len(r["tasks"]) == 2]),
            "all_task_certified_fraction": _fraction([r for r in records if len(r["tasks"]) > 2])}


def _fraction(records: list[dict]) -> float:
    inputs = sum(r["inputs"] for r in records)
    return sum(r["certified"] for r in records) / inputs if inputs else float("nan")


# -- the section of results.json -------------------------------------------------------------------
def run(zoo, echo) -> tuple[dict, dict]:
    """(results["beyond"], results["certify"])."""
    per_seed = []
    for seed in zoo.seeds:
        summary = summarise_sources(source_cells(zoo, seed), zoo)
        per_seed.append(summary)
        echo(f"  beyond, seed {seed}: single-source retention {summary['difference']['single_source_retention']:.3f}, "
             f"consensus {summary['difference']['consensus_retention']:.3f}, relative "
             f"{summary['relative']['single_source_retention']:.3f}, relative consensus "
             f"{summary['relative']['consensus_retention']:.3f}")
    first = zoo.seeds[0]
    # In-distribution tasks (plain style, as pretraining saw): first seed only, as built.
    plain = summarise_sources(source_cells(zoo, first, zoo.in_distribution), zoo, zoo.in_distribution) \
        if zoo.in_distribution else None
    auto = {kind: strength_rows(zoo, first, kind) for kind in ("difference", "relative")}
    echo("  beyond: strength auto at J = 1..{}: {}".format(len(zoo.source_tasks), ", ".join(
        f"{j}: {r['auto']['composed_gain']:+.2f}/{r['auto']['control_delta']:+.2f}" for j, r in auto["difference"].items())))
    certified = certify_cells(zoo, first)
    echo(f"  certify: {certified['certified_fraction']:.1%} certified, {certified['certified_changed']} changed")

    def over_seeds(kind: str, key: str) -> dict:
        values = [s[kind][key] for s in per_seed]
        return {"mean": _mean(values), "values": values}

    beyond = {
        "consensus": {"retention": over_seeds("difference", "consensus_retention")["mean"],
                      "spread": over_seeds("difference", "consensus_retention"),
                      "relative_retention": over_seeds("relative", "consensus_retention")["mean"]},
        "single_source": {"retention": over_seeds("difference", "single_source_retention")["mean"],
                          "spread": over_seeds("difference", "single_source_retention"),
                          "best_fixed_source_retention": over_seeds("difference", "best_fixed_source_retention")["mean"],
                          "best_cell_source_retention": over_seeds("difference", "best_cell_source_retention")["mean"]},
        "relative": {"retention": over_seeds("relative", "single_source_retention")["mean"],
                     "spread": over_seeds("relative", "single_source_retention"),
                     "paper_descriptor_retention": over_seeds("difference", "single_source_retention")["mean"],
                     "shifted": {"relative": over_seeds("relative", "single_source_retention")["mean"],
                                 "paper": over_seeds("difference", "single_source_retention")["mean"],
                                 "oracle_gain": over_seeds("difference", "oracle_gain")["mean"],
                                 "tasks": zoo.source_tasks},
                     "in_distribution": None if plain is None else {
                         "relative": plain["relative"]["single_source_retention"],
                         "paper": plain["difference"]["single_source_retention"],
                         "relative_gain": plain["relative"]["single_gain"], "paper_gain": plain["difference"]["single_gain"],
                         "oracle_gain": plain["difference"]["oracle_gain"], "tasks": zoo.in_distribution,
                         "per_task": {k: plain[k]["per_task"] for k in ("difference", "relative")}}},
        "per_seed": per_seed,
        "auto_strength": auto["difference"], "auto_strength_relative": auto["relative"],
        "strength_config": Strength(mode="auto").model_dump(), "consensus_rule": DEFAULT_RULE,
    }
    return beyond, certified
