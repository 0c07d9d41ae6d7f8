"""Zero-shot top-1 accuracy of a model (or a build output) on a labelled folder."""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

import torch

from ptc import targets
from ptc.compiler.bank.store import TaskRecord
from ptc.compiler.embed import embed_probe_files
from ptc.compiler.method.descriptor import class_embeddings, normalise
from ptc.compiler.tasks.labelled import labelled_files
from ptc.devices import Compute, autocast
from ptc.errors import InputError
from ptc.files import read_json_file
from ptc.targets.base import DualEncoder


class Accuracy(TypedDict):
    """Zero-shot top-1 accuracy of a model on a task's labelled folder."""

    task: str
    accuracy: float
    correct: int
    total: int
    per_class: dict[str, float]


class ModelAccuracy(Accuracy):
    model: str  # the reference or output folder evaluated


class HeldOut(TypedDict):
    """A build's held-out evaluation of one task: the target's accuracy and the edit's."""

    before: float
    after: float
    delta_points: float
    role: str  # "term" or "held out"


def resolve_model(model: str) -> tuple[str, Path]:
    """A build output directory reads as its native checkpoint; anything else is a reference."""
    report = Path(model).expanduser() / "report.json"
    if report.is_file():
        record = read_json_file(report, "build report")
        native = record.get("native_ref") if isinstance(record, dict) else None
        if not isinstance(native, (str, type(None))):
            raise InputError(
                f"{report}: native_ref is not a model reference",
                "the output is damaged; rebuild it",
            )
        if not native:
            raise InputError(
                f"{model}: this build exported no native checkpoint",
                "build with export.formats including safetensors",
            )
        return native, report.parent.resolve()
    return model, Path(".")


def zero_shot_correct(
    encoder: DualEncoder,
    task: TaskRecord,
    pairs: list[tuple[Path, int]],
    batch_size: int = 64,
    progress: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(correct, labels) per (file, class index) pair: whether the encoder's nearest class prompt
    is the file's class."""
    with autocast(encoder):
        class_rows = class_embeddings(
            encoder.embed_prompts(task.prompts).double(), len(task.classes)
        )
    inputs = embed_probe_files(encoder, [p for p, _ in pairs], batch_size, "eval", progress)
    predictions = (normalise(inputs.double()) @ class_rows.T).argmax(dim=1)
    labels = torch.tensor([label for _, label in pairs])
    return predictions == labels, labels


def zero_shot_accuracy(
    encoder: DualEncoder,
    task: TaskRecord,
    data_dir: Path,
    batch_size: int = 64,
    progress: bool = True,
) -> Accuracy:
    pairs = labelled_files(data_dir, task.classes)
    correct, labels = zero_shot_correct(encoder, task, pairs, batch_size, progress)
    per_class = {
        name: float(correct[labels == i].float().mean())
        for i, name in enumerate(task.classes)
        if (labels == i).any()
    }
    return {
        "task": task.name,
        "accuracy": float(correct.float().mean()),
        "correct": int(correct.sum()),
        "total": len(pairs),
        "per_class": per_class,
    }


def evaluate(
    model: str,
    task: TaskRecord,
    data_dir: Path,
    batch_size: int = 64,
    progress: bool = True,
    compute: Compute = Compute(),
) -> ModelAccuracy:
    ref, base = resolve_model(model)
    encoder = compute.place(targets.load(ref, base))
    return {"model": model, **zero_shot_accuracy(encoder, task, data_dir, batch_size, progress)}
