"""Zero-shot top-1 accuracy through the ONNX-only client: the same classifier as the torch
path (each class's prompts normalised, averaged, renormalised; inputs normalised; nearest
class by cosine), in numpy."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ptc.compiler.serve.client import OnnxClient, normalised
from ptc.compiler.tasks.labelled import labelled_files


def class_rows(client: OnnxClient, prompts: list[str], n_classes: int) -> np.ndarray:
    """One row per class from class-major prompts (M x d)."""
    rows = normalised(client.embed_texts(prompts))
    return normalised(rows.reshape(n_classes, -1, rows.shape[-1]).mean(axis=1))


def zero_shot_accuracy(
    client: OnnxClient,
    task: str,
    classes: list[str],
    prompts: list[str],
    data_dir: Path,
    batch_size: int = 64,
) -> dict[str, object]:
    """The torch path's Accuracy record, computed by the client."""
    pairs = labelled_files(data_dir, tuple(classes))
    inputs = client.embed_inputs([path for path, _ in pairs], batch_size)
    predictions = (normalised(inputs) @ class_rows(client, prompts, len(classes)).T).argmax(axis=1)
    labels = np.asarray([label for _, label in pairs])
    correct = predictions == labels
    return {
        "task": task,
        "accuracy": float(correct.mean()),
        "correct": int(correct.sum()),
        "total": len(pairs),
        "per_class": {
            name: float(correct[labels == i].mean())
            for i, name in enumerate(classes)
            if (labels == i).any()
        },
    }
