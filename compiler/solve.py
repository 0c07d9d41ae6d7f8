"""The closed-form transfer: a two-filter ridge solve on cached target factors.

For a target's normalised probe embeddings F (N x d) and class rows G (M x d), the operator
A (d x d) whose first-order descriptor F A^T G^T best matches U (N x M) is

    A^T = (F^T F + lam_F I)^-1 F^T U G (G^T G + lam_G I)^-1
        = V_F diag(s_F / (s_F^2 + lam_F)) U_F^T  U  U_G diag(s_G / (s_G^2 + lam_G)) V_G^T

with lam = ridge * mean(s^2) per factor. The SVDs depend only on (target, grid), so they are
computed once and every further operator is two thin products. Everything here runs in
float64: the solve is a d x d problem and float32 loses ~1e-5 on ill-conditioned grids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .descriptor import normalise


@dataclass(frozen=True)
class GridFactors:
    """Thin SVDs of a target's F and G on one grid (float64)."""

    u_inputs: torch.Tensor   # N x r
    s_inputs: torch.Tensor   # r
    v_inputs: torch.Tensor   # d x r
    u_classes: torch.Tensor  # M x q
    s_classes: torch.Tensor  # q
    v_classes: torch.Tensor  # d x q

    def as_tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> "GridFactors":
        return cls(**{name: tensors[name].double() for name in cls.__dataclass_fields__})


def factorize(input_embeddings: torch.Tensor, class_rows: torch.Tensor) -> GridFactors:
    """SVDs of normalised inputs F and class rows G (both promoted to float64)."""
    u_f, s_f, vh_f = torch.linalg.svd(normalise(input_embeddings.double()), full_matrices=False)
    u_g, s_g, vh_g = torch.linalg.svd(class_rows.double(), full_matrices=False)
    return GridFactors(u_f, s_f, vh_f.T.contiguous(), u_g, s_g, vh_g.T.contiguous())


def ridge_filter(singular_values: torch.Tensor, ridge: float) -> torch.Tensor:
    lam = ridge * singular_values.square().mean()
    return singular_values / (singular_values.square() + lam)


def solve_operator(factors: GridFactors, descriptor: torch.Tensor, ridge: float) -> torch.Tensor:
    """A (d x d, float64) for descriptor U (N x M); linear in U."""
    if descriptor.shape != (factors.u_inputs.shape[0], factors.u_classes.shape[0]):
        raise ValueError(f"descriptor shape {tuple(descriptor.shape)} does not match the grid "
                         f"({factors.u_inputs.shape[0]} probes x {factors.u_classes.shape[0]} classes)")
    core = factors.u_inputs.T @ descriptor.double() @ factors.u_classes  # r x q
    core = ridge_filter(factors.s_inputs, ridge)[:, None] * core * ridge_filter(factors.s_classes, ridge)[None, :]
    operator_t = factors.v_inputs @ core @ factors.v_classes.T
    return operator_t.T.contiguous()


def solve_dense(input_embeddings: torch.Tensor, class_rows: torch.Tensor, descriptor: torch.Tensor,
                ridge: float) -> torch.Tensor:
    """The same solve written with explicit inverses; an independent reference for tests and
    benchmarks, not used by the build."""
    f = normalise(input_embeddings.double())
    g = class_rows.double()
    d = f.shape[1]
    lam_f = ridge * torch.linalg.svdvals(f).square().mean()
    lam_g = ridge * torch.linalg.svdvals(g).square().mean()
    left = torch.linalg.solve(f.T @ f + lam_f * torch.eye(d, dtype=f.dtype), f.T)
    right = torch.linalg.solve(g.T @ g + lam_g * torch.eye(d, dtype=g.dtype), g.T).T
    return (left @ descriptor.double() @ right).T


def first_order_descriptor(input_embeddings: torch.Tensor, class_rows: torch.Tensor,
                           operator: torch.Tensor) -> torch.Tensor:
    """F A^T G^T: the descriptor an edit z -> (I + A) z induces on the grid, to first order."""
    return normalise(input_embeddings.double()) @ operator.double().T @ class_rows.double().T
