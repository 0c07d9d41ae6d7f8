"""Numerical checks a build must pass before anything is written. Each returns the measured
figure; `require` turns a figure over its tolerance into a VerifyError that names both."""

from __future__ import annotations

import numpy as np
import torch

from ptc.compiler.method.descriptor import summed
from ptc.compiler.method.ridge import GridFactors, edited_embeddings, solve_operator
from ptc.errors import VerifyError

# What a figure compares: torch tensors, or the arrays onnxruntime returns.
ArrayLike = torch.Tensor | np.ndarray

LINEARITY_COEFFICIENTS = (1.0, -1.5, 1.0)  # U1 - 1.5 U2 + U3, as in the paper's check


def require(name: str, measured: float, tolerance: float) -> float:
    if not measured <= tolerance:  # also catches NaN
        raise VerifyError(
            f"verification failed: {name} = {measured:.3e} exceeds the tolerance {tolerance:.1e}",
            "nothing was written; inspect the inputs or loosen `verify:` in the recipe",
        )
    return measured


def require_at_least(name: str, measured: float, floor: float) -> float:
    if not measured >= floor:
        raise VerifyError(
            f"verification failed: {name} = {measured:.6f} is below the required {floor}",
            "nothing was written; inspect the inputs or loosen `verify:` in the recipe",
        )
    return measured


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(float(b.norm()), 1e-300))


def max_abs_difference(a: ArrayLike, b: ArrayLike) -> float:
    a, b = torch.as_tensor(a).double(), torch.as_tensor(b).double()
    if a.shape != b.shape:
        raise VerifyError(
            f"verification failed: output shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
        )
    return float((a - b).abs().max()) if a.numel() else 0.0


def linearity_triple(descriptors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Three descriptors of one grid for the U1 - 1.5 U2 + U3 check. With fewer than three in
    the bank, fixed rearrangements of the first stand in: linearity holds for any matrices."""
    triple = [d.double() for d in descriptors[:3]]
    stand_ins = [torch.flip(triple[0], dims=[0]), torch.flip(triple[0], dims=[1])]
    while len(triple) < 3:
        triple.append(stand_ins[len(triple) - 1])
    return triple


def linearity(
    factors: GridFactors, descriptors: list[torch.Tensor], ridge: float
) -> dict[str, float]:
    """Relative Frobenius difference between A(sum c_i U_i) and sum c_i A(U_i): in float64,
    and with the per-term operators rounded to float32 as the bank stores them."""
    triple = linearity_triple(descriptors)
    combined = summed(c * u for c, u in zip(LINEARITY_COEFFICIENTS, triple))
    of_combination = solve_operator(factors, combined, ridge)
    operators = [solve_operator(factors, u, ridge) for u in triple]
    combination_fp64 = summed(c * a for c, a in zip(LINEARITY_COEFFICIENTS, operators))
    combination_fp32 = summed(
        c * a.float().double() for c, a in zip(LINEARITY_COEFFICIENTS, operators)
    )
    return {
        "max_rel_diff_fp64": relative_difference(combination_fp64, of_combination),
        "max_rel_diff_fp32": relative_difference(combination_fp32, of_combination),
    }


def embedding_equivalence(
    base: tuple[torch.Tensor, torch.Tensor | None], edited: torch.Tensor, edit: torch.Tensor
) -> float:
    """max |edited(x) - (z + R E^T)| over the check inputs, the reference computed in float64
    from the unedited model's (z, R)."""
    return max_abs_difference(edited, edited_embeddings(*base, edit))


def descriptor_residual(
    edited_inputs: torch.Tensor,
    pre_inputs: torch.Tensor,
    class_rows: torch.Tensor,
    goal: torch.Tensor,
) -> float:
    """||S_edit - S_pre - goal|| / ||goal||: how far the edited model's own affinity change on a
    grid is from the descriptors it was asked to reproduce (1.0 = no better than no edit)."""
    from ptc.compiler.method.descriptor import affinity

    rows = class_rows.double()
    moved = affinity(edited_inputs.double(), rows) - affinity(pre_inputs.double(), rows)
    return relative_difference(moved, goal.double())
