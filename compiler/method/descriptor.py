"""Affinities and Universal Task Descriptors. Pure tensor math: no files, no models."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable

import torch


def summed(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The tensors added left to right, as `sum` adds them (a tensor, never the start value 0)."""
    return functools.reduce(operator.add, tensors)


def normalise(rows: torch.Tensor) -> torch.Tensor:
    return rows / rows.norm(dim=-1, keepdim=True)


def class_embeddings(prompt_embeddings: torch.Tensor, n_classes: int) -> torch.Tensor:
    """Average the normalised embeddings of each class's templates (prompts are class-major),
    then renormalise: the usual CLIP zero-shot classifier, one row per class (M x d)."""
    per_class = normalise(prompt_embeddings).reshape(n_classes, -1, prompt_embeddings.shape[-1])
    return normalise(per_class.mean(dim=1))


def affinity(input_embeddings: torch.Tensor, class_rows: torch.Tensor) -> torch.Tensor:
    """S = F G^T with F the L2-normalised input embeddings (N x d) and G the class rows (M x d)."""
    return normalise(input_embeddings) @ class_rows.T


def task_descriptor(
    finetuned_inputs: torch.Tensor, pretrained_inputs: torch.Tensor, class_rows: torch.Tensor
) -> torch.Tensor:
    """UTD = S_ft - S_pre (N x M), computed in float64. The text tower is frozen, so both
    affinities share the class rows."""
    class_rows = class_rows.double()
    return affinity(finetuned_inputs.double(), class_rows) - affinity(
        pretrained_inputs.double(), class_rows
    )


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine between two descriptors (or operators) as flattened matrices."""
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def relative_descriptor(
    utd: torch.Tensor, source_affinity: torch.Tensor, target_affinity: torch.Tensor
) -> torch.Tensor:
    """Target-relative descriptor: the source's fine-tuned affinities
    S_ft = UTD + S_pre(source), standardised by the source's pre-trained statistics on the grid
    and put in the target's scale, minus the target's own pre-trained affinities:

        R = mu_t + sigma_t (S_ft - mu_s) / sigma_s - S_pre(target)

    (mu, sigma: mean and standard deviation over the whole grid.) A difference descriptor
    says what the source's fine-tune corrected; R says where the source ended up relative to
    where the target starts, so a target that already agrees with the expert gets a small edit.
    With the target as its own source, R equals the UTD. R is linear in UTD, so weighted sums
    and negation stay well defined: a negative weight moves the target's affinities away from
    the expert's answers, by as much as the target agrees with them (to forget a task the
    target knows well, negate a difference descriptor). Global statistics were chosen over
    per-class or per-probe ones on the zoo's train split (per-class erased most of the gain)."""
    s_pre, t_pre = source_affinity.double(), target_affinity.double()
    if s_pre.shape != utd.shape or t_pre.shape != utd.shape:
        raise ValueError(
            f"affinities {tuple(s_pre.shape)} and {tuple(t_pre.shape)} do not match the "
            f"descriptor {tuple(utd.shape)}"
        )
    finetuned = utd.double() + s_pre
    return t_pre.mean() + t_pre.std() * (finetuned - s_pre.mean()) / s_pre.std() - t_pre


COMBINE_RULES = ("mean", "normalised", "median")
AGREEMENT_FLOOR = 1e-3  # a source that disagrees with the target still counts, barely


def centred(affinities: torch.Tensor) -> torch.Tensor:
    """Each probe's row minus its mean over classes: what can change a prediction."""
    return affinities - affinities.mean(dim=-1, keepdim=True)


def agreement_weights(
    source_affinities: list[torch.Tensor], target_affinity: torch.Tensor
) -> list[float]:
    """Label-free consensus weights: each source's pre-trained affinities on
    the grid against the target's, as the cosine of their row-centred matrices, floored at
    AGREEMENT_FLOOR. A source that already reads the task's probes as the target does is one
    whose fine-tune corrections the target can use; one whose text tower cannot tell the
    classes apart has near-constant rows and weighs little. Chosen over uniform weights on the
    zoo's train split (`python3 -m benchmarks.beyond_choices`)."""
    target = centred(target_affinity.double())
    weights = []
    for source in source_affinities:
        if source.shape != target.shape:
            raise ValueError(
                f"source affinities {tuple(source.shape)} do not match the target's {tuple(target.shape)}"
            )
        source = centred(source.double())
        # Constant rows (a text tower whose class prompts collapsed to one) agree with nothing.
        norms = float(source.norm() * target.norm())
        agreement = float((source * target).sum()) / norms if norms > 0 else 0.0
        weights.append(max(agreement, AGREEMENT_FLOOR))
    return weights


def consensus(
    descriptors: list[torch.Tensor], weights: list[float] | None = None, combine: str = "mean"
) -> torch.Tensor:
    """One descriptor from several sources of the same grid: if their
    model-specific residuals are roughly independent, combining cancels part of them.

    - mean: sum_i c_i U_i with c = weights / sum(weights) (uniform by default);
    - normalised: each U_i scaled to unit norm before the weighted mean, the result rescaled
      to the weighted mean norm, so one source with a large norm does not dominate (a zero
      U_i adds to the mean norm only);
    - median: the element-wise median (robust to one wild source; unweighted)."""
    stacked = torch.stack([u.double() for u in descriptors])
    if combine == "median":
        if weights is not None:
            raise ValueError("a median takes no weights")
        return (
            stacked.median(dim=0).values if len(descriptors) % 2 else stacked.quantile(0.5, dim=0)
        )
    c = (
        torch.ones(len(descriptors), dtype=torch.float64)
        if weights is None
        else torch.tensor(weights, dtype=torch.float64)
    )
    c = c / c.sum()
    if combine == "mean":
        return torch.einsum("i,inm->nm", c, stacked)
    if combine == "normalised":
        norms = stacked.flatten(1).norm(dim=1)
        # A zero descriptor (a fine-tune that moved nothing) has no direction: it lowers the
        # norm, as under `mean`, but takes no share of the direction (1/0 would make it NaN).
        has_direction = norms > 0
        if not has_direction.any():
            return torch.zeros_like(stacked[0])
        share = torch.where(has_direction, c, 0.0)
        share = share / share.sum()
        unit = torch.where(
            has_direction, share / norms.clamp_min(torch.finfo(norms.dtype).tiny), 0.0
        )
        return torch.einsum("i,inm->nm", unit, stacked) * float(c @ norms)
    raise ValueError(f"unknown combine rule {combine!r}; expected one of {COMBINE_RULES}")
