"""Cached target factors and solved operators: compute once per (target, grid) and per
(target, grid, descriptor, ridge), then read from the bank. Shared by `build` and the bulk
bank fill, so both follow one caching rule."""

from __future__ import annotations

from collections import Counter

from .bank import Bank, Entry, TaskRecord
from .embed import GridEmbeddings
from .errors import BankError
from .timers import timed
from .solve import GridFactors, factorize, solve_operator


def ensure_factors(bank: Bank, target_key: str, target, task: TaskRecord, emb: GridEmbeddings,
                   counts: Counter) -> GridFactors:
    def compute():
        with timed("solve"):
            factors = factorize(emb.inputs, emb.class_rows)
        return factors.as_tensors(), {"kind": "factors", "target_ref": target.ref, "task": task.name,
                                      "grid_hash": task.grid_hash}

    entry, computed = bank.get_or_compute(bank.factors_rel(target_key, task.grid_hash), compute)
    counts["factors_computed"] += computed
    return GridFactors.from_tensors(entry.tensors)


def ensure_operator(bank: Bank, target_key: str, target, task: TaskRecord, descriptor: Entry,
                    factors: GridFactors, ridge: float, counts: Counter) -> Entry:
    def compute():
        with timed("solve"):
            operator = solve_operator(factors, descriptor.tensors["utd"], ridge).float()
        return {"operator": operator}, {"kind": "operator", "target_ref": target.ref, "task": task.name,
                                        "source": descriptor.meta.get("id"), "grid_hash": task.grid_hash,
                                        "descriptor_sha256": descriptor.sha256, "ridge": ridge}

    relpath = bank.operator_rel(target_key, task.grid_hash, descriptor.sha256, ridge)
    entry, computed = bank.get_or_compute(relpath, compute)
    counts["operators_solved"] += computed
    if entry.tensors["operator"].shape != (target.embed_dim, target.embed_dim):
        raise BankError(f"operator {entry.path} is {tuple(entry.tensors['operator'].shape)}, the target "
                        f"embeds in {target.embed_dim} dimensions", "delete the entry and rebuild")
    return entry
