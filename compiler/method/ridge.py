"""The closed-form transfer: a two-filter ridge solve on cached target factors.

For a target's normalised probe embeddings F (N x d) and class rows G (M x d), the operator
A (d x d) whose first-order descriptor F A^T G^T best matches U (N x M) is

    A^T = (F^T F + lam_F I)^-1 F^T U G (G^T G + lam_G I)^-1
        = V_F diag(s_F / (s_F^2 + lam_F)) U_F^T  U  U_G diag(s_G / (s_G^2 + lam_G)) V_G^T

with lam = ridge * mean(s^2) per factor. The SVDs depend only on (target, grid), so they are
computed once and every further operator is two thin products. Everything here runs in
float64: the solve is a d x d problem and float32 loses ~1e-5 on ill-conditioned grids.

The same formula solves any edit that moves the embedding linearly through regressor rows,
dz = E r(x) with E (d x p): to first order the normalised embedding moves by E r / ||z||, so
F is replaced by Phi = R / ||z|| (row-wise) and the solve returns E. An (I + A) fold has
r = z (Phi = F, E = A); a SigLIP head edit has r = [u; 1] (E = [dW2 db2]).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from ptc.compiler.method.descriptor import normalise


@dataclass(frozen=True)
class GridFactors:
    """Thin SVDs of a target's F and G on one grid (float64)."""

    u_inputs: torch.Tensor  # N x r
    s_inputs: torch.Tensor  # r
    v_inputs: torch.Tensor  # p x r (p = d for an (I + A) fold)
    u_classes: torch.Tensor  # M x q
    s_classes: torch.Tensor  # q
    v_classes: torch.Tensor  # d x q

    def as_tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor]) -> GridFactors:
        return cls(**{name: tensors[name].double() for name in cls.__dataclass_fields__})


def edit_regressors(
    input_embeddings: torch.Tensor, regressors: torch.Tensor | None = None
) -> torch.Tensor:
    """Phi (N x p, float64): regressor rows over their embedding's norm; F when R is z."""
    if regressors is None:
        return normalise(input_embeddings.double())
    return regressors.double() / input_embeddings.double().norm(dim=-1, keepdim=True)


def edited_embeddings(
    input_embeddings: torch.Tensor, regressors: torch.Tensor | None, edit: torch.Tensor
) -> torch.Tensor:
    """z + R E^T (float64): what an edited model embeds, from the unedited model's cache."""
    z = input_embeddings.double()
    return z + (z if regressors is None else regressors.double()) @ edit.double().T


@contextmanager
def single_thread() -> Iterator[None]:
    """LAPACK's SVD of a few-hundred-wide matrix gains nothing from a second thread and, on a
    machine whose other cores are busy, its threads wait on each other: measured 2.6 s with one
    thread against 30 s with two. It runs on one, whatever torch's setting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def factorize(
    input_embeddings: torch.Tensor, class_rows: torch.Tensor, regressors: torch.Tensor | None = None
) -> GridFactors:
    """SVDs of the regressor rows Phi (F by default) and class rows G, in float64."""
    with single_thread():
        u_f, s_f, vh_f = torch.linalg.svd(
            edit_regressors(input_embeddings, regressors), full_matrices=False
        )
        u_g, s_g, vh_g = torch.linalg.svd(class_rows.double(), full_matrices=False)
    return GridFactors(u_f, s_f, vh_f.T.contiguous(), u_g, s_g, vh_g.T.contiguous())


def ridge_filter(singular_values: torch.Tensor, ridge: float) -> torch.Tensor:
    lam = ridge * singular_values.square().mean()
    return singular_values / (singular_values.square() + lam)


def solve_operator(factors: GridFactors, descriptor: torch.Tensor, ridge: float) -> torch.Tensor:
    """The edit (d x p, float64; A when p = d) for descriptor U (N x M); linear in U."""
    if descriptor.shape != (factors.u_inputs.shape[0], factors.u_classes.shape[0]):
        raise ValueError(
            f"descriptor shape {tuple(descriptor.shape)} does not match the grid "
            f"({factors.u_inputs.shape[0]} probes x {factors.u_classes.shape[0]} classes)"
        )
    core = factors.u_inputs.T @ descriptor.double() @ factors.u_classes  # r x q
    core = (
        ridge_filter(factors.s_inputs, ridge)[:, None]
        * core
        * ridge_filter(factors.s_classes, ridge)[None, :]
    )
    operator_t = factors.v_inputs @ core @ factors.v_classes.T
    return operator_t.T.contiguous()


def solve_dense(
    input_embeddings: torch.Tensor,
    class_rows: torch.Tensor,
    descriptor: torch.Tensor,
    ridge: float,
    regressors: torch.Tensor | None = None,
) -> torch.Tensor:
    """The same solve written with explicit inverses; an independent reference for tests and
    benchmarks, not used by the build."""
    f = edit_regressors(input_embeddings, regressors)
    g = class_rows.double()
    lam_f = ridge * torch.linalg.svdvals(f).square().mean()
    lam_g = ridge * torch.linalg.svdvals(g).square().mean()
    left = torch.linalg.solve(f.T @ f + lam_f * torch.eye(f.shape[1], dtype=f.dtype), f.T)
    right = torch.linalg.solve(g.T @ g + lam_g * torch.eye(g.shape[1], dtype=g.dtype), g.T).T
    return (left @ descriptor.double() @ right).T


def first_order_descriptor(
    input_embeddings: torch.Tensor,
    class_rows: torch.Tensor,
    operator: torch.Tensor,
    regressors: torch.Tensor | None = None,
) -> torch.Tensor:
    """Phi E^T G^T: the descriptor an edit induces on the grid, to first order."""
    return (
        edit_regressors(input_embeddings, regressors) @ operator.double().T @ class_rows.double().T
    )
