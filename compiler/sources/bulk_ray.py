"""Filling a bank on Ray: every (model, grid) forward pass and every solve is a Ray task;
workers keep the models they loaded; the driver alone writes the bank, through the same
record functions as the in-process fill, so both give the same bytes.

Byte identity needs the same arithmetic: each task runs torch with the driver's thread
count (BLAS reductions depend on it) and the same functions on the same inputs.
"""

from __future__ import annotations

import os
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import torch

from ptc.compiler.bank.store import Bank, TaskRecord
from ptc.compiler.edit.operators import check_operator, factors_record, operator_record
from ptc.compiler.embed import GridEmbeddings, ModelInfo, embedding_record, grid_embeddings
from ptc.compiler.method.ridge import GridFactors, factorize, solve_operator
from ptc.compiler.sources.bulk import SourceSpec, same_source
from ptc.compiler.sources.descriptor import check_pair, descriptor_record
from ptc.devices import Compute
from ptc.errors import BankError, PtcError
from ptc.progress import Progress
from ptc.targets.base import DualEncoder

# per worker process: models loaded once, reused by later tasks
_WORKER_MODELS: dict[tuple[str, str | None, str, Compute], DualEncoder] = {}

# Fault injection for tests: the first task to see this marker path missing creates it and
# dies abruptly, as a worker killed mid-job would; Ray then retries the task.
CRASH_ONCE_ENV = "PTC_RAY_CRASH_ONCE"


def _worker_model(ref: str, finetuned: str | None, base_dir: str, compute: Compute) -> DualEncoder:
    from ptc import targets
    from ptc.compiler.sources.descriptor import load_finetuned

    key = (ref, finetuned, base_dir, compute)
    if key not in _WORKER_MODELS:
        model = compute.place(targets.load(ref, Path(base_dir)))
        _WORKER_MODELS[key] = (
            load_finetuned(model, finetuned, Path(base_dir), compute) if finetuned else model
        )
    return _WORKER_MODELS[key]


def _embed_job(
    ref: str,
    finetuned: str | None,
    base_dir: str,
    task: TaskRecord,
    bank_root: str,
    batch_size: int,
    threads: int,
    crash_marker: str | None,
    compute: Compute,
) -> tuple[ModelInfo, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None, Any]:
    """Forward passes of one (model, grid) pair unless the bank has them: (info, tensors or None)."""
    from ptc.compiler.embed import grid_forward, model_info

    torch.set_num_threads(threads)
    model = _worker_model(ref, finetuned, base_dir, compute)
    info = model_info(model)
    bank = Bank(Path(bank_root))
    if bank.read_entry(bank.embeddings_rel(info.key, task.grid_hash)) is not None:
        return info, None, None
    result = grid_forward(model, task, batch_size, progress=False)
    if crash_marker and not os.path.exists(crash_marker):
        Path(crash_marker).touch()
        os._exit(1)
    return info, result, model.device


def _factorize_job(
    inputs: torch.Tensor, class_rows: torch.Tensor, regressors: torch.Tensor | None, threads: int
) -> dict[str, torch.Tensor]:
    torch.set_num_threads(threads)
    return factorize(inputs, class_rows, regressors).as_tensors()


def _solve_job(
    factor_tensors: dict[str, torch.Tensor], descriptor: torch.Tensor, ridge: float, threads: int
) -> torch.Tensor:
    torch.set_num_threads(threads)
    return solve_operator(GridFactors.from_tensors(factor_tensors), descriptor, ridge)


def _gather(ray: Any, refs: list[Any], desc: str, progress: bool) -> list[Any]:
    """ray.get with a progress bar that advances as tasks finish, results in submission order."""
    pending = list(refs)
    with Progress(len(refs), desc, "tasks", progress) as bar:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            bar.update(len(done))
    return ray.get(refs)


def _start(address: str) -> Any:
    try:
        import ray
    except ImportError:
        raise PtcError("--ray needs the ray package", "pip install 'ptc[ray]'") from None
    if not ray.is_initialized():
        if address == "local":
            ray.init(
                num_cpus=os.cpu_count() or 1,
                include_dashboard=False,
                log_to_driver=False,
                configure_logging=False,
            )
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
    return ray


def fill_bank_on_ray(
    bank: Bank,
    sources: list[SourceSpec],
    target_refs: list[str],
    ridge: float,
    base_dir: Path,
    batch_size: int,
    progress: bool,
    address: str,
    compute: Compute = Compute(),
) -> Counter:
    ray = _start(address)
    threads, marker, base = torch.get_num_threads(), os.environ.get(CRASH_ONCE_ENV), str(base_dir)
    embed = ray.remote(max_retries=3)(_embed_job)
    counts: Counter = Counter()
    todo = [
        (s, task)
        for s in sources
        for task in s.finetuned
        if not (
            s.id in bank.descriptor_ids(task)
            and same_source(bank, task, s.id, s.pre, s.finetuned[task])
        )
    ]
    task_names = sorted({t for s in sources for t in s.finetuned})
    # Every forward-pass job of the plan at once: sources (pre and fine-tuned) and targets.
    jobs = [(s.pre, None, task) for s, task in todo] + [
        (s.pre, s.finetuned[task], task) for s, task in todo
    ]
    jobs += [(ref, None, name) for ref in target_refs for name in task_names]
    records = {name: bank.task(name) for name in task_names}
    results = _gather(
        ray,
        [
            embed.remote(
                ref, ft, base, records[name], str(bank.root), batch_size, threads, marker, compute
            )
            for ref, ft, name in jobs
        ],
        "forward passes",
        progress,
    )
    infos: dict[tuple[str, str | None, str], ModelInfo] = {}
    for (ref, ft, name), (info, tensors, device) in zip(jobs, results):
        infos[(ref, ft, name)] = info
        if tensors is not None:
            rel = bank.embeddings_rel(info.key, records[name].grid_hash)
            inputs, prompts, regressors = tensors
            record = partial(
                embedding_record, info, records[name], inputs, prompts, regressors, device=device
            )
            counts["embeddings_computed"] += bank.get_or_compute(rel, record)[1]
    for s, name in todo:  # descriptors, in the in-process order
        task, pre, post = (
            records[name],
            infos[(s.pre, None, name)],
            infos[(s.pre, s.finetuned[name], name)],
        )
        check_pair(pre, post, s.pre, s.finetuned[name])
        tensors, meta = descriptor_record(
            task,
            s.id,
            s.pre,
            s.finetuned[name],
            pre,
            post,
            _embeddings(bank, pre, task),
            _embeddings(bank, post, task),
        )
        bank.put_descriptor(name, s.id, tensors, meta)
        counts["descriptors_computed"] += 1
    counts.update(
        _target_solves(ray, bank, target_refs, task_names, records, infos, ridge, threads, progress)
    )
    return counts


def _embeddings(bank: Bank, info: ModelInfo, task: TaskRecord) -> GridEmbeddings:
    entry = bank.read_entry(bank.embeddings_rel(info.key, task.grid_hash))
    if entry is None:  # every (model, grid) pair was embedded above, before any descriptor
        raise BankError(f"bank {bank.root}: the embeddings of {info.ref} on {task.name} vanished")
    return grid_embeddings(entry, task, False)


def _target_solves(
    ray: Any,
    bank: Bank,
    target_refs: list[str],
    task_names: list[str],
    records: dict[str, TaskRecord],
    infos: dict[tuple[str, str | None, str], ModelInfo],
    ridge: float,
    threads: int,
    progress: bool,
) -> Counter[str]:
    counts: Counter = Counter()
    factorize_remote, solve_remote = (
        ray.remote(max_retries=3)(_factorize_job),
        ray.remote(max_retries=3)(_solve_job),
    )
    pairs = [(ref, name) for ref in target_refs for name in task_names]
    missing = [
        (ref, name)
        for ref, name in pairs
        if bank.read_entry(bank.factors_rel(infos[(ref, None, name)].key, records[name].grid_hash))
        is None
    ]
    jobs = []
    for ref, name in missing:
        emb = _embeddings(bank, infos[(ref, None, name)], records[name])
        jobs.append(factorize_remote.remote(emb.inputs, emb.class_rows, emb.regressors, threads))
    for (ref, name), tensors in zip(missing, _gather(ray, jobs, "factorize", progress)):
        info, task = infos[(ref, None, name)], records[name]
        rel = bank.factors_rel(info.key, task.grid_hash)
        counts["factors_computed"] += bank.get_or_compute(
            rel, partial(factors_record, info.ref, task, GridFactors.from_tensors(tensors))
        )[1]
    solves = []
    for ref, name in pairs:
        info, task = infos[(ref, None, name)], records[name]
        factors_entry = bank.read_entry(bank.factors_rel(info.key, task.grid_hash))
        if factors_entry is None:  # every missing pair was factorized above
            raise BankError(f"bank {bank.root}: the factors of {info.ref} on {task.name} vanished")
        factors = factors_entry.tensors
        for descriptor_id in bank.descriptor_ids(name):
            descriptor = bank.descriptor(name, descriptor_id)
            rel = bank.operator_rel(info.key, task.grid_hash, descriptor.sha256, ridge)
            if bank.read_entry(rel) is None:
                solves.append(
                    (
                        info,
                        task,
                        descriptor,
                        rel,
                        solve_remote.remote(factors, descriptor.tensors["utd"], ridge, threads),
                    )
                )
    operators = _gather(ray, [job for *_, job in solves], "solve", progress)
    for (info, task, descriptor, rel, _), operator in zip(solves, operators):
        entry, computed = bank.get_or_compute(
            rel, partial(operator_record, info.ref, task, descriptor, ridge, operator)
        )
        check_operator(entry, info.embed_dim, info.edit_width)
        counts["operators_solved"] += computed
    return counts
