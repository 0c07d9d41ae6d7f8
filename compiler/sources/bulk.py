"""Filling a bank in bulk: every descriptor of every source on every task, and every
target's factors and operators for them. Each model is loaded once, each (model, grid)
embedded once; whatever the bank already holds is read, not recomputed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.edit.operators import ensure_factors, ensure_operator
from ptc.compiler.embed import embed_grid, model_key
from ptc.compiler.sources.descriptor import add_descriptor
from ptc.devices import Compute


@dataclass(frozen=True)
class SourceSpec:
    id: str
    pre: str  # model reference
    finetuned: dict[str, str]  # task name -> fine-tune reference or adapter folder


def fill_bank(
    bank: Bank,
    sources: list[SourceSpec],
    target_refs: list[str],
    ridge: float = 1.0,
    base_dir: Path = Path("."),
    batch_size: int = 64,
    progress: bool = True,
    compute: Compute = Compute(),
) -> Counter:
    counts: Counter = Counter()
    embeddings_before = _count_embeddings(bank)
    for spec in sources:
        source = compute.place(targets.load(spec.pre, base_dir))
        for task_name, finetuned in spec.finetuned.items():
            existing = bank.descriptor_ids(task_name)
            if spec.id in existing and same_source(bank, task_name, spec.id, spec.pre, finetuned):
                continue
            add_descriptor(
                bank,
                task_name,
                spec.pre,
                finetuned,
                spec.id,
                base_dir,
                batch_size,
                progress,
                source,
                compute,
            )
            counts["descriptors_computed"] += 1
    task_names = sorted({t for spec in sources for t in spec.finetuned})
    for ref in target_refs:
        target = compute.place(targets.load(ref, base_dir))
        key = model_key(target)
        for task_name in task_names:
            task = bank.task(task_name)
            emb = embed_grid(target, task, bank, batch_size, progress)
            factors = ensure_factors(bank, key, target, task, emb, counts)
            for descriptor_id in bank.descriptor_ids(task_name):
                ensure_operator(
                    bank,
                    key,
                    target,
                    task,
                    bank.descriptor(task_name, descriptor_id),
                    factors,
                    ridge,
                    counts,
                )
    # sources' and targets'
    counts["embeddings_computed"] = _count_embeddings(bank) - embeddings_before
    return counts


def _count_embeddings(bank: Bank) -> int:
    return sum(1 for _ in bank.root.glob("embeddings/*/*.safetensors"))


def same_source(bank: Bank, task: str, descriptor_id: str, pre: str, finetuned: str) -> bool:
    meta = bank.descriptor(task, descriptor_id).meta
    return (
        meta.get("source_ref") == pre
        and meta.get("finetuned_ref") == finetuned
        and meta.get("grid_hash") == bank.task(task).grid_hash
    )
