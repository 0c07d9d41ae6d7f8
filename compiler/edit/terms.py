"""From planned terms to the descriptors the solve uses, once the target's grids are embedded.

A plain term (one source, `kind: difference`) uses its bank entry as is, so its operator is
cached under the entry's hash exactly as before. A consensus or a relative term gets a
descriptor made here (descriptor.consensus, descriptor.relative_descriptor) and keyed by its
own content hash: a relative descriptor depends on the target, so its operator cache entry
(which is per target anyway) is too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from ptc.compiler.bank.store import Entry
from ptc.compiler.embed import GridEmbeddings
from ptc.compiler.method.descriptor import (
    affinity,
    agreement_weights,
    consensus,
    relative_descriptor,
)
from ptc.compiler.recipe.plan import Plan, PlannedTerm
from ptc.compiler.recipe.schema import Term
from ptc.hashing import tensors_sha256


def source_descriptor(entry: Entry, kind: str, target_affinity: torch.Tensor) -> torch.Tensor:
    """One source's descriptor as the term reads it (float64)."""
    if kind == "relative":
        return relative_descriptor(
            entry.tensors["utd"], entry.tensors["source_affinity"], target_affinity
        )
    return entry.tensors["utd"].double()


def source_weights(
    term: Term, entries: Sequence[Entry], target_affinity: torch.Tensor
) -> list[float] | None:
    """The consensus weights a term asks for (None: unweighted, i.e. uniform or a median)."""
    if term.weighting == "agreement":
        return agreement_weights(
            [entry.tensors["source_affinity"] for entry in entries], target_affinity
        )
    if term.weighting == "explicit" and isinstance(term.source_weights, tuple):
        return list(term.source_weights)
    return None


def combined_descriptor(
    term: Term, entries: Sequence[Entry], target_affinity: torch.Tensor
) -> tuple[torch.Tensor, list[float] | None]:
    """(the term's descriptor on this target, the consensus weights used or None)."""
    parts = [source_descriptor(entry, term.kind, target_affinity) for entry in entries]
    if len(parts) == 1:
        return parts[0], None
    weights = source_weights(term, entries, target_affinity)
    return consensus(parts, weights, term.combine), weights


def term_descriptor(pt: PlannedTerm, grid: GridEmbeddings) -> Entry:
    """The term's descriptor as a bank-style entry (not written to the bank)."""
    term = pt.term
    utd, weights = combined_descriptor(
        term, pt.sources, affinity(grid.inputs.double(), grid.class_rows.double())
    )
    tensors = {"utd": utd.contiguous()}
    meta = {
        "id": term.label,
        "kind": term.kind,
        "combine": term.combine if len(pt.sources) > 1 else None,
        "weighting": term.weighting,
        "source_weights": weights,
        "sources": [entry.meta.get("id") for entry in pt.sources],
        "source_sha256": [entry.sha256 for entry in pt.sources],
        "grid_hash": pt.task.grid_hash,
    }
    return Entry(
        pt.sources[0].path, tensors, meta, tensors_sha256(tensors, prefix=f"ptc-term|{term.kind}|")
    )


def resolve_descriptors(plan: Plan, grids: dict[str, GridEmbeddings]) -> Plan:
    """The plan with every term's `descriptor` filled in for this target."""
    terms = tuple(
        pt
        if pt.descriptor is not None
        else replace(pt, descriptor=term_descriptor(pt, grids[pt.task.name]))
        for pt in plan.terms
    )
    return replace(plan, terms=terms)


def with_weights(plan: Plan, weights: list[float]) -> Plan:
    return replace(plan, terms=tuple(replace(pt, weight=w) for pt, w in zip(plan.terms, weights)))
