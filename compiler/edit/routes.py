"""The two routes from descriptors to an edited model. Each takes the planned terms and the
target's grid embeddings and returns an `Edit`: the edited model, its embeddings of every
grid's probes, its torch-level equivalence figure and what it adds to report and lock.

- closed form: cached factors, one solve per term, A = sum w_l A_l folded into the last affine;
- adapter: a LoRA fitted to sum w U on every grid jointly, merged into the weights.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import torch
from safetensors.torch import load_file

from ptc.compiler.edit.adapter import GridGoal, fit_adapter
from ptc.compiler.edit.operators import ensure_factors, ensure_operator
from ptc.compiler.embed import GridEmbeddings, check_reference, embed_probe_files
from ptc.compiler.method.descriptor import affinity, summed
from ptc.compiler.method.ridge import GridFactors, edited_embeddings, factorize, solve_operator
from ptc.compiler.recipe.options import Options
from ptc.compiler.recipe.plan import Plan
from ptc.compiler.recipe.schema import RouteName
from ptc.compiler.verify.checks import (
    descriptor_residual,
    embedding_equivalence,
    linearity,
    max_abs_difference,
    require,
)
from ptc.finite import require_finite
from ptc.hashing import tensors_sha256
from ptc.memory import restart_stretch, stretch_peak_mb
from ptc.targets.base import Batch, DualEncoder, Family

OUTSIDE_STAGES = "outside_stages"


@dataclass
class Run:
    """Mutable bookkeeping of one execution: stage timings, each stage's peak resident memory
    (where the system measures it: ptc/memory.py) and cache counters."""

    timings: dict[str, float] = field(default_factory=dict)
    peaks: dict[str, float] = field(default_factory=dict)  # MB
    counts: Counter = field(
        default_factory=lambda: Counter(
            embeddings_computed=0,
            factors_computed=0,
            operators_solved=0,
            check_references_computed=0,
        )
    )
    _open: list[str] = field(default_factory=list)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        self.close_stretch()
        self._open.append(name)
        try:
            yield
        finally:
            self.close_stretch()
            self._open.pop()
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start

    def close_stretch(self) -> None:
        """The peak since the last stage boundary belongs to every stage open through it, or to
        `outside_stages` (start-up, the work between stages)."""
        peak = stretch_peak_mb()
        if peak is not None and restart_stretch():
            for name in self._open or [OUTSIDE_STAGES]:
                self.peaks[name] = max(self.peaks.get(name, 0.0), peak)


@dataclass(frozen=True)
class Check:
    """The one small batch of probe files every verification of a build runs on."""

    paths: list[Path]
    batch: Batch
    key: str  # which probes of which grids they are (compiler/embed.py check_reference)
    # the target's (z, R) of them, if the grid cache holds the torch fp32 reference
    base: tuple[torch.Tensor, torch.Tensor | None] | None = None
    # the target's unnormalised embedding of each prompt the cache holds on the same terms
    prompts: dict[str, torch.Tensor] = field(default_factory=dict)


@dataclass
class Edit:
    """What a route hands back to the build."""

    edited: Family
    grid_inputs: dict[str, torch.Tensor]
    check_outputs: torch.Tensor  # the edited model's embeddings of the check batch, computed once
    torch_max_abs_diff: float
    report: dict[str, Any]
    lock: dict[str, Any]
    term_hashes: list[str | None]
    card: str
    # per-term signed edits (closed form): the certificate's input
    term_edits: list[torch.Tensor] | None = None


def grid_goals(plan: Plan, grids: dict[str, GridEmbeddings]) -> dict[str, torch.Tensor]:
    """sum_l w_l U_l per grid (float64): what the edit should do to each grid's affinities."""
    goals: dict[str, torch.Tensor] = {}
    for pt in plan.terms:
        scaled = pt.weight * pt.resolved.tensors["utd"].double()
        goals[pt.task.name] = goals[pt.task.name] + scaled if pt.task.name in goals else scaled
    return goals


def _linearity(plan: Plan, factors: dict[str, GridFactors], ridge: float) -> dict[str, Any]:
    """Per task grid: the terms' descriptors, then more of that task from the bank, three in all."""
    per_task = {}
    for name, grid_factors in factors.items():
        mine = [pt for pt in plan.terms if pt.task.name == name]
        used = {source for pt in mine for source in pt.term.sources}
        descriptors = [pt.resolved.tensors["utd"] for pt in mine][:3]
        for extra in [i for i in plan.bank.descriptor_ids(name) if i not in used][
            : 3 - len(descriptors)
        ]:
            descriptors.append(plan.bank.descriptor(name, extra).tensors["utd"])
        per_task[name] = linearity(grid_factors, descriptors, ridge)
    return {
        "max_rel_diff_fp64": max(v["max_rel_diff_fp64"] for v in per_task.values()),
        "max_rel_diff_fp32": max(v["max_rel_diff_fp32"] for v in per_task.values()),
        "per_task": per_task,
    }


def _embedding_operator_reference(
    plan: Plan, grids: dict[str, GridEmbeddings], ridge: float
) -> dict[str, Any] | None:
    """Where the edit acts through other rows than z (a residual pooling head), the paper reads
    it against the same solve as a d x d operator applied outside the model, which no weight
    edit of that architecture realizes: its descriptor residual per grid, reported only."""
    if all(emb.regressors is None for emb in grids.values()):
        return None
    factors = {name: factorize(emb.inputs, emb.class_rows) for name, emb in grids.items()}
    operator = summed(
        pt.weight * solve_operator(factors[pt.task.name], pt.resolved.tensors["utd"], ridge)
        for pt in plan.terms
    )
    goals = grid_goals(plan, grids)
    return {
        "descriptor_residual": {
            name: descriptor_residual(
                edited_embeddings(emb.inputs, None, operator),
                emb.inputs,
                emb.class_rows,
                goals[name],
            )
            for name, emb in grids.items()
        },
        "operator_norm": float(operator.norm()),
    }


def edited_check_outputs(edited: DualEncoder, check: Check) -> torch.Tensor:
    outputs = edited.embed_inputs(check.batch)
    require_finite(
        {"embeddings": outputs},
        "the edited model on the check inputs",
        "nothing was written; the edit overflows the model's numbers (lower the terms' weights)",
    )
    return outputs


def closed_form(
    plan: Plan,
    target: Family,
    target_key: str,
    grids: dict[str, GridEmbeddings],
    check: Check,
    run: Run,
    options: Options,
) -> Edit:
    recipe, ridge = plan.recipe, plan.recipe.solve.ridge
    with run.stage("factorize"):
        factors = {
            name: ensure_factors(
                plan.bank, target_key, target, plan.bank.task(name), emb, run.counts
            )
            for name, emb in grids.items()
        }
    with run.stage("solve"):
        operators = [
            ensure_operator(
                plan.bank,
                target_key,
                target,
                pt.task,
                pt.resolved,
                factors[pt.task.name],
                ridge,
                run.counts,
            )
            for pt in plan.terms
        ]
        term_edits = [
            pt.weight * op.tensors["operator"].double() for pt, op in zip(plan.terms, operators)
        ]
        edit = summed(term_edits)
        require_finite(
            {"edit": edit}, "the recipe's signed sum of operators", "lower the terms' weights"
        )
    with run.stage("verify_linearity"):
        lin = _linearity(plan, factors, ridge)
        require(
            "linearity max_rel_diff_fp64",
            lin["max_rel_diff_fp64"],
            recipe.verify.linearity_rtol_fp64,
        )
        require(
            "linearity max_rel_diff_fp32", lin["max_rel_diff_fp32"], recipe.verify.linearity_rtol
        )
    with run.stage("fold"):
        edited = target.with_edit(edit)
    with run.stage("verify_torch"):
        check_outputs = edited_check_outputs(edited, check)
        base = check.base
        if base is None:  # the grids ran on another runtime: the bank's reference, or a pass
            base, computed = check_reference(plan.bank, target, check.key, check.batch)
            run.counts["check_references_computed"] += computed
        diff = embedding_equivalence(base, check_outputs, edit)
        require("torch_max_abs_diff (edited vs z + R E^T)", diff, recipe.verify.equivalence_atol)
    # The fold is exact (just checked), so the edited grid embeddings follow from the cache.
    grid_inputs = {
        name: edited_embeddings(emb.inputs, emb.regressors, edit) for name, emb in grids.items()
    }
    report = {"linearity": lin, "operator_norm": float(edit.norm()), "edit_shape": list(edit.shape)}
    reference = _embedding_operator_reference(plan, grids, ridge)
    if reference is not None:
        report["embedding_operator_reference"] = reference
    return Edit(
        edited,
        grid_inputs,
        check_outputs,
        diff,
        report,
        {"solve": {"ridge": ridge}},
        [op.sha256 for op in operators],
        f"The closed-form edit (the signed sum of the operators below) is folded into {target.edit_site}",
        term_edits,
    )


def adapter(
    plan: Plan,
    target: Family,
    target_key: str,
    grids: dict[str, GridEmbeddings],
    check: Check,
    run: Run,
    options: Options,
) -> Edit:
    cfg, device = plan.recipe.adapter, options.compute().resolved()
    goals = grid_goals(plan, grids)
    with run.stage("adapter_inputs"):
        fit_goals = []
        for name, emb in grids.items():
            task = plan.bank.task(name)
            fit_goals.append(
                GridGoal(
                    name,
                    tuple(task.probes),
                    emb.class_rows.float().to(device),
                    affinity(emb.inputs.double(), emb.class_rows).float().to(device),
                    goals[name].float().to(device),
                )
            )
    with tempfile.TemporaryDirectory(prefix="ptc-adapter-") as folder, run.stage("adapter_train"):
        module, stats = fit_adapter(
            target,
            fit_goals,
            Path(folder),
            rank=cfg.rank,
            alpha=cfg.alpha,
            epochs=cfg.epochs,
            max_steps=cfg.max_steps,
            lr=cfg.lr,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            device=device,
            progress=options.progress,
        )
        adapter_sha = tensors_sha256(load_file(Path(folder) / "adapter_model.safetensors"))
        edited = target.with_adapter(Path(folder))  # merged: no LoRA modules are exported
    with run.stage("verify_torch"):
        with torch.no_grad():
            unmerged = target.embed_with(module.cpu(), check.batch)
        check_outputs = edited_check_outputs(edited, check)
        diff = max_abs_difference(check_outputs, unmerged)
        require(
            "torch_max_abs_diff (merged vs unmerged adapter)",
            diff,
            plan.recipe.verify.equivalence_atol,
        )
    with run.stage("embed_edited"):
        grid_inputs = {
            name: embed_probe_files(
                edited,
                list(plan.bank.task(name).probes),
                options.batch_size,
                f"edited {name}",
                options.progress,
            )
            for name in grids
        }
    return Edit(
        edited,
        grid_inputs,
        check_outputs,
        diff,
        {"adapter": stats, "linearity": None},
        {"adapter": {**cfg.model_dump(), "sha256": adapter_sha}},
        [None] * len(plan.terms),
        f"A rank-{cfg.rank} LoRA on the input tower's attention q/v projections, fitted to the "
        "signed sum of the descriptors below and merged into the weights",
    )


# Every route the recipe schema names (recipe.RouteName), found here as the function of that name.
ROUTES = {name: globals()[name] for name in get_args(RouteName)}
