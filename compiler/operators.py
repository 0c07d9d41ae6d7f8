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
    entry = bank.factors(target_key, task.grid_hash)
    if entry is None:
        with timed("solve"):
            factors = factorize(emb.inputs, emb.class_rows)
        entry = bank.put_factors(target_key, task.grid_hash, factors.as_tensors(),
                                 {"kind": "factors", "target_ref": target.ref, "task": task.name,
                                  "grid_hash": task.grid_hash})
        counts["factors_computed"] += 1
    return GridFactors.from_tensors(entry.tensors)


def ensure_operator(bank: Bank, target_key: str, target, task: TaskRecord, descriptor: Entry,
                    factors: GridFactors, ridge: float, counts: Counter) -> Entry:
    entry = bank.operator(target_key, task.grid_hash, descriptor.sha256, ridge)
    if entry is None:
        with timed("solve"):
            operator = solve_operator(factors, descriptor.tensors["utd"], ridge).float()
        entry = bank.put_operator(target_key, task.grid_hash, descriptor.sha256, ridge, operator,
                                  {"kind": "operator", "target_ref": target.ref, "task": task.name,
                                   "source": descriptor.meta.get("id"), "descriptor_sha256": descriptor.sha256,
                                   "grid_hash": task.grid_hash, "ridge": ridge})
        counts["operators_solved"] += 1
    if entry.tensors["operator"].shape != (target.embed_dim, target.embed_dim):
        raise BankError(f"operator {entry.path} is {tuple(entry.tensors['operator'].shape)}, the target "
                        f"embeds in {target.embed_dim} dimensions", "delete the entry and rebuild")
    return entry
