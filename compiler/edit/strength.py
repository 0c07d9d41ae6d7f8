"""`strength: auto`: choosing every term's strength without labels.

The paper fixes alpha = 0.5 (0.5/J for J tasks). Here each term keeps its sign and its
magnitude m_l >= 0 minimises, in closed form,

    sum_g ||sum_l m_l s_l P_lg - T_g||^2 / ||T_g||^2  +  mu / |C| sum_c ||sum_l m_l s_l Q_lc||^2 / ||S_c||^2

- P_lg: the first-order descriptor that term l's operator, solved WITHOUT a fold of probes,
  induces on those held-out probes of term grid g (K folds, each probe held out once);
- T_g = sum of the signed descriptors of the terms on grid g, on the same held-out probes;
- Q_lc: what term l's operator (solved on all probes) does to control grid c, a task no
  term edits, centred per probe (a shift shared by all of a probe's classes changes no
  prediction); S_c that grid's pre-trained affinities, centred alike; mu = control_weight.

The first part asks how much of each descriptor the target can reproduce on probes the solve
never saw, with the other terms' spill-over on the same grid counted (so J interfering terms
get smaller strengths, as 0.5/J does by rule). The second bounds the predicted movement of
unrelated affinities. It is a J x J non-negative least-squares problem; magnitudes are then
capped at max_weight. No label, and no test data, enters it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ptc.compiler.embed import GridEmbeddings
from ptc.compiler.method.descriptor import affinity, centred, summed
from ptc.compiler.method.ridge import edit_regressors, factorize, solve_operator
from ptc.compiler.recipe.plan import PlannedTerm
from ptc.compiler.recipe.schema import Strength


def _rows(emb: GridEmbeddings, mask: torch.Tensor | None = None) -> torch.Tensor:
    if mask is None:
        return edit_regressors(emb.inputs, emb.regressors)
    return edit_regressors(
        emb.inputs[mask], None if emb.regressors is None else emb.regressors[mask]
    )


def _induced(
    emb: GridEmbeddings, operator: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    return _rows(emb, mask) @ operator.T @ emb.class_rows.double().T


def _fold_masks(n: int, folds: int) -> list[torch.Tensor]:
    index = torch.arange(n)
    return [index % folds == k for k in range(folds)]


def nonnegative_least_squares(gram: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """argmin_{m >= 0} m^T gram m - 2 rhs^T m, by an active set (J is small)."""
    active = list(range(len(rhs)))
    solution = torch.zeros_like(rhs)
    while active:
        sub = torch.linalg.lstsq(gram[active][:, active], rhs[active][:, None]).solution[:, 0]
        if (sub >= 0).all():
            solution[active] = sub
            break
        active = [a for a, value in zip(active, sub) if value >= 0]
    return solution


def choose_strengths(
    terms: list[tuple[str, torch.Tensor, float]],
    grids: dict[str, GridEmbeddings],
    controls: dict[str, GridEmbeddings],
    ridge: float,
    config: Strength,
) -> dict[str, Any]:
    """terms: (task, descriptor, sign) per term. Returns the signed weights and why."""
    count = len(terms)
    gram = torch.zeros(count, count, dtype=torch.float64)
    rhs = torch.zeros(count, dtype=torch.float64)
    term_tasks = list(dict.fromkeys(task for task, _, _ in terms))
    goal = {
        g: summed(sign * u.double() for task, u, sign in terms if task == g) for g in term_tasks
    }
    goal_scale = {g: float(goal[g].square().sum()) or 1.0 for g in term_tasks}
    induced_held: dict[str, list[list[torch.Tensor]]] = {g: [] for g in term_tasks}
    for k in range(config.folds):
        operators = []
        for task, u, sign in terms:
            emb = grids[task]
            fit = ~_fold_masks(emb.inputs.shape[0], config.folds)[k]
            factors = factorize(
                emb.inputs[fit],
                emb.class_rows,
                None if emb.regressors is None else emb.regressors[fit],
            )
            operators.append(sign * solve_operator(factors, u.double()[fit], ridge))
        for g in term_tasks:
            held = _fold_masks(grids[g].inputs.shape[0], config.folds)[k]
            induced = [_induced(grids[g], a, held) for a in operators]
            induced_held[g].append(induced)
            for i in range(count):
                rhs[i] += float((induced[i] * goal[g][held]).sum()) / goal_scale[g]
                for j in range(count):
                    gram[i, j] += float((induced[i] * induced[j]).sum()) / goal_scale[g]
    full = [sign * solve_operator_on(grids[task], u, ridge) for task, u, sign in terms]
    control_induced, control_scale = {}, {}
    for name, emb in controls.items():
        pre = affinity(emb.inputs.double(), emb.class_rows.double())
        control_scale[name] = float(centred(pre).square().sum()) or 1.0
        # Only the part of a probe's movement that differs between classes can change its
        # prediction; a shift shared by every class of a probe cannot.
        control_induced[name] = [centred(_induced(emb, a)) for a in full]
        for i in range(count):
            for j in range(count):
                gram[i, j] += (
                    config.control_weight
                    / len(controls)
                    * float((control_induced[name][i] * control_induced[name][j]).sum())
                    / control_scale[name]
                )
    magnitudes = nonnegative_least_squares(gram, rhs).clamp(max=config.max_weight)

    def figures(m: torch.Tensor) -> dict[str, Any]:
        held = {}
        for g in term_tasks:
            residual = sum(
                float(
                    (
                        summed(m[i] * parts[i] for i in range(count))
                        - goal[g][_fold_masks(grids[g].inputs.shape[0], config.folds)[k]]
                    )
                    .square()
                    .sum()
                )
                for k, parts in enumerate(induced_held[g])
            )
            held[g] = (residual / goal_scale[g]) ** 0.5
        moved = {
            c: float(
                summed(m[i] * control_induced[c][i] for i in range(count)).square().sum()
                / control_scale[c]
            )
            ** 0.5
            for c in controls
        }
        return {"heldout_residual": held, "control_movement": moved}

    return {
        "weights": [float(sign * m) for (_, _, sign), m in zip(terms, magnitudes)],
        "chosen": figures(magnitudes),
        "at_fixed_0.5": figures(torch.full((count,), 0.5, dtype=torch.float64)),
    }


def solve_operator_on(emb: GridEmbeddings, descriptor: torch.Tensor, ridge: float) -> torch.Tensor:
    return solve_operator(
        factorize(emb.inputs, emb.class_rows, emb.regressors), descriptor.double(), ridge
    )


def strength_report(
    plan_terms: Sequence[PlannedTerm],
    result: dict[str, Any],
    config: Strength,
    controls: list[str],
) -> dict[str, Any]:
    """What `strength: auto` chose and why, for report.json and the build's output."""
    return {
        "mode": "auto",
        "folds": config.folds,
        "control_weight": config.control_weight,
        "max_weight": config.max_weight,
        "control_tasks": controls,
        "weights": [
            {"task": pt.term.task, "source": pt.term.label, "written": pt.term.weight, "chosen": w}
            for pt, w in zip(plan_terms, result["weights"])
        ],
        "chosen": result["chosen"],
        "at_fixed_0.5": result["at_fixed_0.5"],
        "why": (
            "magnitudes minimise the held-out descriptor residual (each probe left out of the solve "
            "once) plus control_weight x the predicted movement of the control grids"
            + ("" if controls else "; no control grid (no other task in the bank): unbounded")
        ),
    }
