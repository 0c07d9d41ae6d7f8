"""Sources: a pre-trained model and its fine-tune, turned into a descriptor in the bank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ptc import targets
from ptc.compiler.bank.store import Bank, Entry, TaskRecord
from ptc.compiler.embed import (
    GridEmbeddings,
    ModelInfo,
    check_grid_unchanged,
    embed_grid,
    model_info,
)
from ptc.compiler.method.descriptor import affinity, task_descriptor
from ptc.compiler.tasks.grid import check_name
from ptc.devices import Compute
from ptc.errors import ModelError
from ptc.targets.base import DualEncoder


def _finetuned_ref(source_ref: str, finetuned: str, base_dir: Path) -> Path | str:
    """How a fine-tune is named: a peft adapter folder (a Path) or a model reference (a str); a
    bare full-checkpoint folder reads with the source's scheme."""
    path = (base_dir / finetuned).expanduser()
    if path.is_dir() and (path / "adapter_config.json").is_file():
        return path.resolve()
    if ":" in finetuned and finetuned.split(":", 1)[0] in targets.SCHEMES:
        return finetuned
    scheme, _ = targets.split_ref(source_ref)
    return f"{scheme}:{finetuned}"


def load_finetuned(
    source: DualEncoder, finetuned: str, base_dir: Path, compute: Compute = Compute()
) -> DualEncoder:
    """A peft adapter folder (merged into a copy of `source`), a scheme reference, or a bare
    full-checkpoint folder (read with the source's scheme); placed as `compute` says."""
    ref = _finetuned_ref(source.ref, finetuned, base_dir)
    if isinstance(ref, Path):
        return compute.place(source.with_adapter(ref))
    return compute.place(targets.load(ref, base_dir))


def check_finetuned(source_ref: str, finetuned: str, base_dir: Path) -> str:
    """Resolve a fine-tune the way load_finetuned reads it, loading no weights."""
    from ptc.targets.shipped_code import refuse_unsafe_adapter

    ref = _finetuned_ref(source_ref, finetuned, base_dir)
    if isinstance(ref, Path):
        refuse_unsafe_adapter(ref, source_ref)
        return str(ref)
    return targets.check(ref, base_dir)


def check_pair(
    source: ModelInfo, finetuned: ModelInfo, source_ref: str, finetuned_ref: str
) -> None:
    """A descriptor assumes the fine-tune kept the source's text tower and width."""
    if finetuned.text_fingerprint != source.text_fingerprint:
        raise ModelError(
            f"{finetuned_ref}: the fine-tune changed the text tower of {source_ref} "
            f"(text hash {finetuned.text_fingerprint[:12]} != {source.text_fingerprint[:12]})",
            "descriptors assume a frozen text tower; fine-tune the image tower only",
        )
    if finetuned.embed_dim != source.embed_dim:
        raise ModelError(
            f"{finetuned_ref}: embedding width {finetuned.embed_dim} differs from the source's "
            f"{source.embed_dim}",
            "the fine-tune must share the source's architecture",
        )


def descriptor_record(
    task: TaskRecord,
    descriptor_id: str,
    source_ref: str,
    finetuned_ref: str,
    source: ModelInfo,
    finetuned: ModelInfo,
    pre: GridEmbeddings,
    post: GridEmbeddings,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, meta) of a descriptor; one definition for every executor. Beside UTD the entry
    keeps the source's own pre-trained affinities S_pre on the grid: with them a target can
    read the source's fine-tuned affinities (UTD + S_pre), which `kind: relative` needs."""
    utd = task_descriptor(post.inputs, pre.inputs, pre.class_rows).float()
    source_affinity = affinity(pre.inputs.double(), pre.class_rows.double()).float()
    meta = {
        "kind": "descriptor",
        "task": task.name,
        "id": descriptor_id,
        "grid_hash": task.grid_hash,
        "source_ref": source_ref,
        "finetuned_ref": finetuned_ref,
        "source_input_fingerprint": source.input_fingerprint,
        "finetuned_input_fingerprint": finetuned.input_fingerprint,
        "text_fingerprint": source.text_fingerprint,
        "finetuned_text_fingerprint": finetuned.text_fingerprint,
        "norm": float(utd.norm()),
        "shape": list(utd.shape),
        "precision": source.precision,
    }
    return {"utd": utd, "source_affinity": source_affinity}, meta


def add_descriptor(
    bank: Bank,
    task_name: str,
    source_ref: str,
    finetuned_ref: str,
    descriptor_id: str,
    base_dir: Path = Path("."),
    batch_size: int = 64,
    progress: bool = True,
    source: DualEncoder | None = None,
    compute: Compute = Compute(),
) -> Entry:
    """Embed the task's grid with the source and its fine-tune and store UTD = S_ft - S_pre.
    `source` may be passed already loaded and placed (bulk fills load each source once)."""
    task = bank.task(task_name)
    check_name("descriptor", descriptor_id)
    check_grid_unchanged(task)  # bad input is reported before any weights load
    source = source or compute.place(targets.load(source_ref, base_dir))
    finetuned = load_finetuned(source, finetuned_ref, base_dir, compute)
    check_pair(model_info(source), model_info(finetuned), source_ref, finetuned_ref)
    # The fine-tune first: it is the input a user damages, and its embeddings refused leave the
    # bank as it was (the source's would be cached by then otherwise).
    post = embed_grid(finetuned, task, bank, batch_size, progress)
    pre = embed_grid(source, task, bank, batch_size, progress)
    tensors, meta = descriptor_record(
        task,
        descriptor_id,
        source_ref,
        finetuned_ref,
        model_info(source),
        model_info(finetuned),
        pre,
        post,
    )
    return bank.put_descriptor(task.name, descriptor_id, tensors, meta)
