"""Finite numbers only. One NaN or Inf in a weight, an embedding or a solved operator spreads
to every number computed from it (an SVD refuses it, an argmax quietly picks class 0), so ptc
refuses a non-finite tensor where it first appears: before it is stored, cached or used."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from ptc.errors import PtcError
from ptc.timers import timed

if TYPE_CHECKING:  # torch loads with the first check, not with `ptc task list`'s import of the bank
    import torch


class NonFiniteError(PtcError):
    """A tensor read or computed holds NaN or Inf; the message names where and which tensor."""


def _is_finite(tensor: torch.Tensor) -> bool:
    import torch

    # A sum reads the tensor once and allocates nothing: NaN and Inf propagate into it, so a
    # finite sum proves every value finite. Only a non-finite sum (which an overflow of finite
    # values can also give) pays for the exact, element-wise test.
    if tensor.device.type == "meta" or not (tensor.is_floating_point() or tensor.is_complex()):
        return True
    if tensor.numel() == 0 or bool(torch.isfinite(tensor.sum())):
        return True
    return bool(torch.isfinite(tensor).all())


def first_non_finite(
    named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
) -> tuple[str, int, int] | None:
    """(name, how many values are NaN or Inf, how many values) of the first floating tensor
    that holds one; None when every value is finite."""
    import torch

    items = named.items() if isinstance(named, Mapping) else named
    with timed("finite_checks"), torch.no_grad():
        for name, tensor in items:
            if not _is_finite(tensor):
                return name, int((~torch.isfinite(tensor)).sum()), tensor.numel()
    return None


def require_finite(
    named: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    where: str,
    hint: str | None = None,
) -> None:
    """NonFiniteError naming `where` (a file, an entry, a stage) and the first bad tensor."""
    found = first_non_finite(named)
    if found is not None:
        name, bad, total = found
        raise NonFiniteError(
            f"{where}: tensor {name!r} holds NaN or Inf ({bad:,} of {total:,} values)", hint
        )
