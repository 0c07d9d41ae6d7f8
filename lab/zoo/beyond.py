"""`ptc paper`'s experiments on what ptc adds to the paper, on held-out test splits: consensus
descriptors, target-relative descriptors, label-free strength and the composition certificate.

Every edit goes through the code a recipe runs: descriptor.consensus and relative_descriptor
(terms.py's rules), strength.choose_strengths and certify.certificate. Cells and gains are
as in paper.py: percentage points against the target's zero-shot, retention pooled over cells
(sum of gains over the sum of the paired Oracle gains).
"""

from __future__ import annotations

import itertools

import torch

from ptc.compiler.verify.certify import certificate
from ptc.compiler.method.descriptor import affinity, consensus, cosine
from ptc.compiler.recipe.schema import Strength, Term
from ptc.compiler.edit.strength import choose_strengths
from ptc.compiler.edit.terms import combined_descriptor, source_descriptor
from ptc.lab.zoo.paper import _mean, _points
from ptc.lab.zoo.report import ratio

ALPHA = 0.5
DEFAULT_RULE = "agreement"  # the headline consensus is what a recipe term gets by default


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
UNWEIGHTED_RULES = ("mean", "normalised", "median")
RULES = (*UNWEIGHTED_RULES, "agreement")  # agreement: what a recipe's consensus term does by default


def source_cells(zoo, seed: int, tasks: list[str] | None = None, subsets: bool = True) -> list[dict]:
    """Per (target, task): the Oracle gain, every single cross-model source's gain and (with
    `subsets`) the consensus of every subset of the other members under every rule, for both
    descriptor kinds. The `agreement` rule is a recipe's default consensus term, read through
    terms.combined_descriptor; the others are the plain rules with uniform weights."""
    reader, cells = Descriptors(zoo, seed), []
    for target in zoo.members:
        view = zoo.view(target)
        others = [m for m in zoo.members if m != target]
        for task in zoo.source_tasks if tasks is None else tasks:
            base = view.accuracy(task)
            gain = lambda u: _points(view.accuracy(task, view.operator(task, u, ALPHA)), base)  # noqa: E731
            own = reader.paper(task, target, target)
            target_affinity = reader.pre_affinity(target, task)
            cell = {"target": target, "task": task, "seed": seed, "oracle_gain": gain(own), "kinds": {}}
            for kind in ("difference", "relative"):
                read = reader.of(kind)
                singles = {s: read(task, s, target) for s in others}
                row = {"single": {s: gain(u) for s, u in singles.items()},
                       "single_cosine_to_own": {s: cosine(u, own) for s, u in singles.items()}, "consensus": {}}
                for n in range(1, len(others) + 1) if subsets else ():
                    for subset in itertools.combinations(others, n):
                        parts = [singles[s] for s in subset]
                        term = Term(task=task, source=[f"{s}-s{seed}" for s in subset], kind=kind, weight=ALPHA)
                        entries = [zoo.bank.descriptor(task, i) for i in term.sources]
                        weighted, weights = combined_descriptor(term, entries, target_affinity)
                        combined = {rule: consensus(parts, combine=rule) for rule in UNWEIGHTED_RULES}
                        combined["agreement"] = weighted
                        for rule, u in combined.items():
                            row["consensus"].setdefault(rule, {}).setdefault(str(n), []).append(
                                {"sources": list(subset), "gain": gain(u), "cosine_to_own": cosine(u, own),
                                 **({"weights": weights} if rule == "agreement" else {})})
                # Every other member's every fine-tune in the bank (in-distribution tasks have one seed).
                bank_ids = [f"{s}-s{k}" for s in others for k in zoo.seeds]
                if subsets and len(zoo.seeds) > 1 and set(bank_ids) <= set(zoo.bank.descriptor_ids(task)):
                    term = Term(task=task, source=bank_ids, kind=kind, weight=ALPHA)
                    u, _ = combined_descriptor(term, [zoo.bank.descriptor(task, i) for i in term.sources],
                                               target_affinity)
                    row["bank_consensus"] = {"gain": gain(u), "cosine_to_own": cosine(u, own),
                                             "sources": list(term.sources)}
                cell["kinds"][kind] = row
            cells.append(cell)
    return cells


def best_source_per_target(cells: list[dict], kind: str, chooser: list[dict] | None = None) -> dict[str, str]:
    """Per target, the source member whose transfers gain most over `chooser`'s cells (the
    labelled train split's, or the scored cells themselves: a hindsight choice)."""
    chooser = cells if chooser is None else chooser
    best = {}
    for target in dict.fromkeys(c["target"] for c in cells):
        mine = [c for c in chooser if c["target"] == target]
        if mine:
            sources = list(mine[0]["kinds"][kind]["single"])
            best[target] = max(sources, key=lambda s: sum(c["kinds"][kind]["single"][s] for c in mine))
    return best


def summarise_sources(cells: list[dict], zoo, tasks: list[str] | None = None,
                      train_cells: list[dict] | None = None) -> dict:
    """Retention against the number of sources, best single sources (chosen per target on the
    train split's cells when given, and with hindsight on the scored cells), agreement with
    the Oracle."""
    everyone = str(len(zoo.members) - 1)
    oracle = [c["oracle_gain"] for c in cells]
    out = {}
    for kind in ("difference", "relative"):
        oracle_per_single = [c["oracle_gain"] for c in cells for _ in c["kinds"][kind]["single"]]
        singles = [g for c in cells for g in c["kinds"][kind]["single"].values()]

        def fixed_source_retention(best: dict[str, str]) -> float:
            return _retention([c["kinds"][kind]["single"][best[c["target"]]] for c in cells], oracle)

        best_cell = [max(c["kinds"][kind]["single"].values()) for c in cells]
        rules = {rule: {n: _retention([r["gain"] for c in cells for r in c["kinds"][kind]["consensus"][rule][n]],
                                      [c["oracle_gain"] for c in cells for _ in c["kinds"][kind]["consensus"][rule][n]])
                        for n in cells[0]["kinds"][kind]["consensus"][rule]} for rule in RULES}
        by_count = {"1": _retention(singles, oracle_per_single), **rules[DEFAULT_RULE]}
        all_sources = [c["kinds"][kind]["consensus"][DEFAULT_RULE][everyone][0] for c in cells]
        chosen_on_train = best_source_per_target(cells, kind, train_cells) if train_cells else None
        out[kind] = {
            "single_source_retention": by_count["1"],
            "best_fixed_source_retention": fixed_source_retention(best_source_per_target(cells, kind)),
            "train_chosen_source_retention": fixed_source_retention(chosen_on_train) if chosen_on_train else None,
            "train_chosen_sources": chosen_on_train,
            "best_cell_source_retention": _retention(best_cell, oracle),
            "consensus_retention": _retention([r["gain"] for r in all_sources], oracle),
            "bank_consensus_retention": _retention([c["kinds"][kind]["bank_consensus"]["gain"] for c in cells], oracle)
            if all("bank_consensus" in c["kinds"][kind] for c in cells) else None,
            "retention_by_sources": by_count, "retention_by_rule": rules,
            "single_gain": _mean(singles), "consensus_gain": _mean(r["gain"] for r in all_sources),
            "oracle_gain": _mean(oracle),
            "single_cosine_to_own": _mean(v for c in cells for v in c["kinds"][kind]["single_cosine_to_own"].values()),
            "consensus_cosine_to_own": _mean(r["cosine_to_own"] for r in all_sources),
            "consensus_weights": _mean_weights(cells, kind, everyone),
            "per_task": {task: {"single": _retention(
                [g for c in cells if c["task"] == task for g in c["kinds"][kind]["single"].values()],
                [c["oracle_gain"] for c in cells if c["task"] == task for _ in c["kinds"][kind]["single"]]),
                "consensus": _retention([c["kinds"][kind]["consensus"][DEFAULT_RULE][everyone][0]["gain"]
                                         for c in cells if c["task"] == task],
                                        [c["oracle_gain"] for c in cells if c["task"] == task])}
                for task in (zoo.source_tasks if tasks is None else tasks)},
            "cells": len(cells)}
    return out


def _mean_weights(cells: list[dict], kind: str, everyone: str) -> dict[str, float]:
    """Mean normalised agreement weight each member got as a source of the all-others consensus."""
    shares: dict[str, list[float]] = {}
    for c in cells:
        record = c["kinds"][kind]["consensus"]["agreement"][everyone][0]
        weights = record["weights"] or [1.0] * len(record["sources"])  # one source: no weighting
        total = sum(weights)
        for source, w in zip(record["sources"], weights):
            shares.setdefault(source, []).append(w / total)
    return {source: _mean(values) for source, values in sorted(shares.items())}


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
def run(zoo, train, echo) -> tuple[dict, dict]:
    """(results["beyond"], results["certify"]); `train` is the same zoo opened on its train
    split, where a labelled choice of source is made."""
    per_seed = []
    for seed in zoo.seeds:
        summary = summarise_sources(source_cells(zoo, seed), zoo, train_cells=source_cells(train, seed, subsets=False))
        per_seed.append(summary)
        difference, relative = summary["difference"], summary["relative"]
        echo(f"  beyond, seed {seed}: single-source retention {ratio(difference['single_source_retention'])}, "
             f"best source chosen on train {ratio(difference['train_chosen_source_retention'])}, "
             f"consensus {ratio(difference['consensus_retention'])}, relative "
             f"{ratio(relative['single_source_retention'])}, relative consensus {ratio(relative['consensus_retention'])}")
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
                      "relative_retention": over_seeds("relative", "consensus_retention")["mean"],
                      "relative_spread": over_seeds("relative", "consensus_retention"),
                      "bank": None if per_seed[0]["difference"]["bank_consensus_retention"] is None else {
                          "retention": over_seeds("difference", "bank_consensus_retention")["mean"],
                          "spread": over_seeds("difference", "bank_consensus_retention"),
                          "relative_retention": over_seeds("relative", "bank_consensus_retention")["mean"],
                          "relative_spread": over_seeds("relative", "bank_consensus_retention")},
                      "weighting": "agreement"},
        "single_source": {"retention": over_seeds("difference", "single_source_retention")["mean"],
                          "spread": over_seeds("difference", "single_source_retention"),
                          "best_fixed_source_retention": over_seeds("difference", "best_fixed_source_retention")["mean"],
                          "train_chosen_source_retention": over_seeds("difference", "train_chosen_source_retention")["mean"],
                          "relative_best_fixed_source_retention":
                              over_seeds("relative", "best_fixed_source_retention")["mean"],
                          "relative_train_chosen_source_retention":
                              over_seeds("relative", "train_chosen_source_retention")["mean"],
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
