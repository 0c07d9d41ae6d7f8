"""Affinities and Universal Task Descriptors. Pure tensor math: no files, no models."""

from __future__ import annotations

import torch


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


def task_descriptor(finetuned_inputs: torch.Tensor, pretrained_inputs: torch.Tensor,
                    class_rows: torch.Tensor) -> torch.Tensor:
    """UTD = S_ft - S_pre (N x M), computed in float64. The text tower is frozen, so both
    affinities share the class rows."""
    class_rows = class_rows.double()
    return affinity(finetuned_inputs.double(), class_rows) - affinity(pretrained_inputs.double(), class_rows)


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine between two descriptors (or operators) as flattened matrices."""
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))
