"""What `--precision bf16` does to the numbers an edit is made of, measured on the zoo's test
split, first seed, on a copy of the zoo.

Every forward pass an edit needs runs twice, once in fp32 and once under torch's bf16 autocast,
the same way `ptc build --precision bf16` and `ptc descriptor add --precision bf16` run them:
each member's grid embeddings and test split, and each descriptor, recomputed from its
committed source and fine-tune. The solve, the fold and every check stay in fp64/fp32, as in a
build. It prints and writes (`--out`) how far the descriptors and grid embeddings moved, and
`ptc paper`'s addition figures (Oracle and cross-model gains, pooled retention, the control's
delta) under each precision, with the per-cell differences of the gains.

bf16 is only faster where the CPU has bf16 instructions (AVX-512 bf16 or AMX); its figures are
the same whatever runs them, up to the kernels' rounding.

    python3 -m ptc.lab.benchmarks.bf16_zoo [--zoo zoo] [--out benchmarks/results-bf16-zoo.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from ptc.compiler.method.descriptor import centred, cosine
from ptc.devices import CPU, cpu_name, place
from ptc.lab.zoo.paper import Zoo, addition_cells, descriptor_on_grid, retention

PRECISIONS = ("fp32", "bf16")
RIDGE = 1e-3  # what `ptc paper` chose on the zoo's train split (results/paper-full.json)


class PrecisionZoo(Zoo):
    """The zoo with every member's passes in one precision, and each descriptor recomputed from
    its source's fine-tune in that precision (the bank's were made in fp32)."""

    def __init__(self, root: Path, precision: str):
        super().__init__(root)
        self.precision = precision
        self._descriptors: dict[tuple[str, str, int], torch.Tensor] = {}

    def encoder(self, member: str):
        return place(super().encoder(member), CPU, self.precision)

    def descriptor(self, task: str, member: str, seed: int) -> torch.Tensor:
        key = (task, member, seed)
        if key not in self._descriptors:
            tuned = self.view(member).encoder.with_adapter(self.adapter(member, task, seed))
            with torch.inference_mode():
                utd = descriptor_on_grid(self, member, place(tuned, CPU, self.precision), task)
            self._descriptors[key] = utd.double()
        return self._descriptors[key]


def copy_of_zoo(zoo: Path, folder: Path) -> Path:
    """The zoo without its bank's caches: this run fills the copy's with bf16 entries."""
    caches = ("embeddings", "factors", "operators", "checks", "exports", "runtimes", ".locks")
    shutil.copytree(zoo, folder, ignore=shutil.ignore_patterns(*caches, ".tmp"))
    return folder


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, in fp64."""
    return float((a.double() - b.double()).norm() / b.double().norm())


def summary(cells: list[dict]) -> dict:
    return {
        "oracle_gain": statistics.fmean(c["oracle_gain"] for c in cells),
        "cross_model_gain": statistics.fmean(c["cross_model_gain"] for c in cells),
        "control_delta": statistics.fmean(c["control_delta"] for c in cells),
        "retention": retention(cells),
        "cells": len(cells),
    }


def run(root: Path) -> dict:
    zoos = {precision: PrecisionZoo(root, precision) for precision in PRECISIONS}
    seed = zoos["fp32"].seeds[0]
    for zoo in zoos.values():
        zoo.use_ridge(RIDGE)
    cells, seconds = {}, {}
    for precision, zoo in zoos.items():
        start = time.perf_counter()
        with torch.inference_mode():
            cells[precision] = addition_cells(zoo, seed)
        seconds[precision] = time.perf_counter() - start
        print(
            f"{precision}: {len(cells[precision])} cells in {seconds[precision]:.0f} s", flush=True
        )
    fp32, bf16 = zoos["fp32"], zoos["bf16"]
    descriptors = []
    for (task, member, _), u in fp32._descriptors.items():
        v = bf16.descriptor(task, member, seed)
        bank_utd = fp32.bank.descriptor(task, f"{member}-s{seed}").tensors["utd"]
        descriptors.append(
            {
                "task": task,
                "source": member,
                "relative_difference": relative(v, u),
                "centred_cosine": cosine(centred(v), centred(u)),
                # the recomputed fp32 descriptor against the bank's (made by `ptc zoo build`)
                "fp32_vs_bank": relative(u, bank_utd),
            }
        )
    grids = [
        {
            "member": member,
            "task": task,
            "relative_difference": relative(
                bf16.view(member).grids[task].inputs, fp32.view(member).grids[task].inputs
            ),
        }
        for member in fp32.members
        for task in fp32.source_tasks
    ]
    paired = list(zip(cells["fp32"], cells["bf16"]))
    assert all(
        (a["target"], a["task"], a["source"]) == (b["target"], b["task"], b["source"])
        for a, b in paired
    )
    gain_moves = [abs(b["cross_model_gain"] - a["cross_model_gain"]) for a, b in paired]
    return {
        "machine": {
            "cpu": cpu_name(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
        },
        "seed": seed,
        "split": "test",
        "ridge": RIDGE,
        "seconds": seconds,
        "addition": {precision: summary(rows) for precision, rows in cells.items()},
        "cross_model_gain_change_points": {
            "mean_abs": statistics.fmean(gain_moves),
            "max_abs": max(gain_moves),
            "sign_flips": sum(
                (a["cross_model_gain"] > 0) != (b["cross_model_gain"] > 0) for a, b in paired
            ),
        },
        "descriptors": descriptors,
        "descriptor_relative_difference": {
            "median": statistics.median(d["relative_difference"] for d in descriptors),
            "max": max(d["relative_difference"] for d in descriptors),
        },
        "grid_relative_difference": {
            "median": statistics.median(g["relative_difference"] for g in grids),
            "max": max(g["relative_difference"] for g in grids),
        },
        "grids": grids,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=Path("zoo"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ptc-bf16-zoo-") as scratch:
        copy = copy_of_zoo(args.zoo, Path(scratch) / "zoo")
        results = run(copy)
    for precision, row in results["addition"].items():
        print(
            f"{precision}: Oracle {row['oracle_gain']:+.2f}, cross-model {row['cross_model_gain']:+.2f}, "
            f"control {row['control_delta']:+.2f} points, retention {row['retention']:.3f}"
        )
    moves = results["cross_model_gain_change_points"]
    print(
        f"cross-model gain, bf16 against fp32: mean |change| {moves['mean_abs']:.2f} points, "
        f"max {moves['max_abs']:.2f}, sign flips {moves['sign_flips']}"
    )
    print(
        "descriptors, ||bf16 - fp32|| / ||fp32||: median "
        f"{results['descriptor_relative_difference']['median']:.2e}, max "
        f"{results['descriptor_relative_difference']['max']:.2e}; grid embeddings: median "
        f"{results['grid_relative_difference']['median']:.2e}"
    )
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
