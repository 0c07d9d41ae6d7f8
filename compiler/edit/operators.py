"""Cached target factors and solved operators: compute once per (target, grid) and per
(target, grid, descriptor, ridge), then read from the bank. Shared by `build` and the bulk
bank fill, so both follow one caching rule."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch

from ptc.compiler.bank.store import Bank, Entry, TaskRecord
from ptc.compiler.embed import GridEmbeddings
from ptc.compiler.method.ridge import GridFactors, factorize, solve_operator
from ptc.errors import BankError
from ptc.targets.base import DualEncoder
from ptc.timers import timed


def factors_record(
    target_ref: str, task: TaskRecord, factors: GridFactors
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return factors.as_tensors(), {
        "kind": "factors",
        "target_ref": target_ref,
        "task": task.name,
        "grid_hash": task.grid_hash,
    }


def operator_record(
    target_ref: str, task: TaskRecord, descriptor: Entry, ridge: float, operator: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    return {"operator": operator.float()}, {
        "kind": "operator",
        "target_ref": target_ref,
        "task": task.name,
        "source": descriptor.meta.get("id"),
        "grid_hash": task.grid_hash,
        "descriptor_sha256": descriptor.sha256,
        "ridge": ridge,
    }


def timed_factorize(emb: GridEmbeddings) -> GridFactors:
    with timed("solve"):
        return factorize(emb.inputs, emb.class_rows, emb.regressors)


def timed_solve(factors: GridFactors, descriptor: Entry, ridge: float) -> torch.Tensor:
    with timed("solve"):
        return solve_operator(factors, descriptor.tensors["utd"], ridge)


def check_operator(entry: Entry, embed_dim: int, edit_width: int) -> Entry:
    if entry.tensors["operator"].shape != (embed_dim, edit_width):
        raise BankError(
            f"operator {entry.path} is {tuple(entry.tensors['operator'].shape)}, the target's "
            f"edits are {embed_dim} x {edit_width}",
            "delete the entry and rebuild",
        )
    return entry


def ensure_factors(
    bank: Bank,
    target_key: str,
    target: DualEncoder,
    task: TaskRecord,
    emb: GridEmbeddings,
    counts: Counter,
) -> GridFactors:
    entry, computed = bank.get_or_compute(
        bank.factors_rel(target_key, task.grid_hash),
        lambda: factors_record(target.ref, task, timed_factorize(emb)),
    )
    counts["factors_computed"] += computed
    return GridFactors.from_tensors(entry.tensors)


def ensure_operator(
    bank: Bank,
    target_key: str,
    target: DualEncoder,
    task: TaskRecord,
    descriptor: Entry,
    factors: GridFactors,
    ridge: float,
    counts: Counter,
) -> Entry:
    relpath = bank.operator_rel(target_key, task.grid_hash, descriptor.sha256, ridge)
    entry, computed = bank.get_or_compute(
        relpath,
        lambda: operator_record(
            target.ref, task, descriptor, ridge, timed_solve(factors, descriptor, ridge)
        ),
    )
    counts["operators_solved"] += computed
    return check_operator(entry, target.embed_dim, target.edit_width)
