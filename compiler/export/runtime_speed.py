"""Which fp32 runtime embeds a model faster on this machine, measured once and kept in the bank.

onnxruntime runs most towers faster than torch eager on a CPU, but not all: on one 2-core AMD
EPYC it ran SigLIP so400m at 0.72x torch's images/s, and ViT-H/14 at 0.89x in runs of 64 (1.31x
in runs of 8; benchmarks/README.md). So `--embed-runtime auto` times both on a few of the
build's own probe files, through the same base export the embed stage would run, and keeps the
figures in the bank under the model's weights and this machine. Later builds read them: the
runtime names the cached embeddings' key, and a choice that changed from run to run would miss
the cache.

torch is timed before the session opens, and its tower is paged out while onnxruntime is
timed, so the tower's two copies (torch's, the session's) are never resident together: taking
turns on 8 inputs, they made ViT-B/16's cold-build peak, 2.10 GB (2.35x the model above the
libraries; `ptc bench --size vit-b16` at e8f5b497, a run not committed).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from contextlib import ExitStack

import torch

from ptc.compiler.bank.store import Bank
from ptc.compiler.embed import CPU_RUN, ONNXRUNTIME, TORCH, InputForward
from ptc.devices import cpu_name
from ptc.progress import note
from ptc.targets.base import Batch, Family, batch_len, batch_rows

# onnxruntime stays the choice unless it measured slower than this share of torch's rate: a
# margin keeps a near tie, whose winner a noisy timing could flip, on the runtime `auto` picked
# before it measured.
KEEP_ONNXRUNTIME_ABOVE = 0.95
# Timed per round, after one input's warm-up run: one forward pass of the size every CPU pass
# runs (compiler/embed.py CPU_RUN), on either runtime. Four inputs, half a run, gave onnxruntime
# 0.97x torch at ViT-H/14 where its whole grid ran at 1.31x (`ptc bench --size vit-h14`).
SAMPLE_INPUTS = CPU_RUN
# Each runtime runs at least MIN_ROUNDS rounds, and more (up to MAX_ROUNDS) until it has run
# MIN_SECONDS. A single round decided EVA02-L/14 wrongly: torch 0.636 against onnxruntime's
# 0.556 images/s, where runs by hand gave 0.68-0.74 and 0.74-0.82 (benchmarks/README.md).
MIN_ROUNDS = 2
MIN_SECONDS = 1.0
MAX_ROUNDS = 3


def machine_label() -> str:
    """What decides the two runtimes' relative speed: the CPU, the cores this process may use,
    torch's threads and both libraries' versions."""
    import onnxruntime

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cpu_name()}, {cores} cores, torch {torch.__version__} ({torch.get_num_threads()} threads), "
        f"onnxruntime {onnxruntime.__version__}"
    )


def speed_key(weights_key: str, machine: str) -> str:
    return f"{weights_key}-{hashlib.sha256(machine.encode()).hexdigest()[:12]}"


def recorded_runtime(bank: Bank, weights_key: str) -> str | None:
    """The runtime the bank's record for this model on this machine chose; None before one."""
    record = bank.runtime_speed(speed_key(weights_key, machine_label()))
    return None if record is None else str(record["chosen"])


def chosen_runtime(bank: Bank, weights_key: str, measure: Callable[[], str]) -> str:
    """The runtime recorded for this model on this machine, or the one `measure()` chooses
    (and records). Builds that need the same measurement take turns: one measures, the others
    wait and read its record; timings taken while another build shares the cores decide
    wrongly, and a model measured twice is time lost. A recorded choice takes no lock."""
    recorded = recorded_runtime(bank, weights_key)
    if recorded is not None:
        return recorded
    with ExitStack() as held:
        try:
            held.enter_context(bank.lock(f"runtimes/{speed_key(weights_key, machine_label())}"))
        except PermissionError:  # a bank shared read-only: no lock, and no record to share
            pass
        return recorded_runtime(bank, weights_key) or measure()


def images_per_second(forward: InputForward, batch: Batch) -> float:
    """How fast `forward` embeds `batch`: the best of its rounds, after a warm-up run on its
    first input (first-call allocations, kernel choice, a session's own set-up)."""
    count = batch_len(batch)
    best, spent = float("inf"), 0.0
    with torch.inference_mode():
        forward(batch_rows(batch, slice(0, 1)))
        for round_ in range(1, MAX_ROUNDS + 1):
            seconds = _timed(forward, batch)
            best, spent = min(best, seconds), spent + seconds
            if round_ >= MIN_ROUNDS and spent >= MIN_SECONDS:
                break
    return count / best


def record_choice(
    model: Family, bank: Bank, weights_key: str, rates: dict[str, float], inputs: int
) -> str:
    """The runtime the two rates choose, recorded in the bank for this model and machine."""
    keep = rates[ONNXRUNTIME] >= KEEP_ONNXRUNTIME_ABOVE * rates[TORCH]
    chosen = ONNXRUNTIME if keep else TORCH
    machine = machine_label()
    record = {
        "model_ref": model.ref,
        "machine": machine,
        "images_per_second": rates,
        "inputs": inputs,
        "chosen": chosen,
    }
    try:
        bank.put_runtime_speed(speed_key(weights_key, machine), record)
        kept = "kept in the bank"
    except PermissionError:  # a bank shared read-only: each build measures again
        kept = "not kept: the bank is read-only"
    note(
        f"embedding runtime: {chosen} (images/s on this machine: torch "
        f"{rates[TORCH]:.3g}, onnxruntime {rates[ONNXRUNTIME]:.3g}; {kept})"
    )
    return chosen


def _timed(forward: InputForward, batch: Batch) -> float:
    start = time.perf_counter()
    forward(batch)
    return time.perf_counter() - start
