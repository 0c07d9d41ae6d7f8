"""The build measured against its physical floor, side by side in one run on this machine.

Every figure is a ratio of two things timed here, now: a bank build against the bare
forward passes it needs, the cached solve against a solve that recomputes its SVDs, a warm
compile split by stage, the edited ONNX tower's latency against the unedited one's and an
unmerged LoRA's, the forward passes of a warm rebuild, and how solve and bank build scale.
Models are random-weight CLIPs of the selected size, built from configs; images are noise.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import yaml

SIZES = {  # model and grid sizes; probes per task, classes per task
    "tiny": dict(
        width=48,
        layers=2,
        heads=2,
        image_size=32,
        patch_size=8,
        embed_dim=32,
        probes=64,
        classes=10,
    ),
    "small": dict(
        width=192,
        layers=4,
        heads=4,
        image_size=64,
        patch_size=8,
        embed_dim=128,
        probes=256,
        classes=20,
    ),
    "vit-b": dict(
        width=768,
        layers=12,
        heads=12,
        image_size=224,
        patch_size=16,
        embed_dim=512,
        probes=128,
        classes=50,
    ),
}


@dataclass(frozen=True)
class Effort:
    """How hard each section works: the shapes and repeats behind its figures."""

    bank_shape: tuple[int, int, int]  # targets x sources x tasks
    bank_repeats: int  # fresh banks filled; the ratio is of their medians
    solve_repeats: int
    latency_repeats: int
    scaling_axis_points: int  # of the solve's N, M and d grids, the first this many
    scaling_probes: tuple[int, ...]  # bank builds of one task at these probe counts


EFFORTS = {
    "full": Effort((2, 2, 4), 1, 5, 300, 4, (128, 512, 2048, 4096)),
    "quick": Effort((1, 2, 4), 3, 5, 300, 4, (128, 512, 2048)),
    # Every section once at the least work that still yields each figure: shows the bench runs
    # end to end (the tests' use); its ratios are not measurements.
    "smoke": Effort((1, 2, 4), 1, 1, 20, 2, (64, 128)),
}


# -- fixtures built on the spot -------------------------------------------------------------------
def _write_tasks(root: Path, size: dict, count: int, seed: int = 0) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    files = []
    for k in range(count):
        folder = root / f"task{k}"
        (folder / "probes").mkdir(parents=True, exist_ok=True)
        for i in range(size["probes"]):
            pixels = rng.integers(
                0, 256, (size["image_size"], size["image_size"], 3), dtype=np.uint8
            )
            Image.fromarray(pixels).save(folder / "probes" / f"{i:05d}.png")
        spec = {
            "name": f"task{k}",
            "probes": "probes",
            "classes": [f"class {k} {c}" for c in range(size["classes"])],
            "templates": ["a photo of a {}.", "an image of {}."],
        }
        (folder / "task.yaml").write_text(yaml.safe_dump(spec))
        files.append(folder / "task.yaml")
    return files


def _model(folder: Path, size: dict, seed: int, width_scale: float = 1.0) -> str:
    from ptc.lab.tiny.hf_clip import build_tiny

    width = int(size["width"] * width_scale) // size["heads"] * size["heads"]
    build_tiny(
        folder,
        width=width,
        embed_dim=int(size["embed_dim"] * width_scale),
        layers=size["layers"],
        heads=size["heads"],
        image_size=size["image_size"],
        patch_size=size["patch_size"],
        seed=seed,
    )
    return f"hf:{folder}"


def _random_adapter(encoder, folder: Path, seed: int) -> Path:
    """A rank-4 q/v LoRA with random factors: a stand-in fine-tune (training is not measured here)."""
    from ptc.compiler.edit.lora import attach_lora

    module = attach_lora(encoder, rank=4, alpha=8, seed=seed, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(seed)
    for parameter in module.parameters():
        if parameter.requires_grad:
            parameter.data.normal_(0.0, 0.05, generator=generator)
    module.save_pretrained(folder)
    return folder


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _exponent(xs, ys) -> float:
    """Least-squares slope of log y against log x: the measured scaling exponent."""
    lx, ly = np.log(np.asarray(xs, float)), np.log(np.asarray(ys, float))
    return float(np.polyfit(lx, ly, 1)[0])


# -- 1. bank build vs the forward-pass floor ------------------------------------------------------
def _bank_world(root: Path, size: dict, n_targets: int, n_sources: int, n_tasks: int):
    from ptc import targets
    from ptc.compiler.sources.bulk import SourceSpec

    task_files = _write_tasks(root / "tasks", size, n_tasks)
    sources = []
    for s in range(n_sources):
        ref = _model(
            root / "models" / f"source{s}", size, seed=10 + s, width_scale=0.75 if s % 2 else 1.0
        )
        encoder = targets.load(ref)
        adapters = {
            f"task{k}": str(
                _random_adapter(encoder, root / "adapters" / f"s{s}-t{k}", seed=100 * s + k)
            )
            for k in range(n_tasks)
        }
        sources.append(SourceSpec(f"source{s}", ref, adapters))
    target_refs = [
        _model(root / "models" / f"target{t}", size, seed=50 + t) for t in range(n_targets)
    ]
    return task_files, sources, target_refs


def _forward_floor(sources, target_refs, bank) -> dict:
    """Decode + forward of every (model, grid) pair a bank build needs, models preloaded."""
    from ptc import targets
    from ptc.compiler.embed import embed_probe_files

    pairs = []
    for spec in sources:
        pre = targets.load(spec.pre)
        for task_name, adapter in spec.finetuned.items():
            pairs += [(pre, task_name), (pre.with_adapter(Path(adapter)), task_name)]
    for ref in target_refs:
        target = targets.load(ref)
        pairs += [(target, name) for name in sorted({t for s in sources for t in s.finetuned})]
    total = 0.0
    with torch.inference_mode():
        for model, task_name in pairs:
            task = bank.task(task_name)
            start = time.perf_counter()
            embed_probe_files(model, list(task.probes), 64, "floor", progress=False)
            model.embed_prompts(task.prompts)
            total += time.perf_counter() - start
    return {"seconds": total, "model_grid_pairs": len(pairs)}


def bench_bank_build(
    root: Path, size: dict, n_targets: int, n_sources: int, n_tasks: int, repeats: int = 1
) -> dict:
    """Fill `repeats` fresh banks, timing the bare forward floor before, between and after
    them: the machine's drift and torch's first-call warm-up then hit both sides alike, and
    the ratio is of the medians."""
    from ptc import timers
    from ptc.compiler.bank.store import Bank
    from ptc.compiler.sources.bulk import fill_bank
    from ptc.compiler.tasks.grid import load_task

    task_files, sources, target_refs = _bank_world(root, size, n_targets, n_sources, n_tasks)
    specs = [load_task(task_file) for task_file in task_files]
    floors, walls = [], []
    for attempt in range(repeats):
        bank = Bank(root / f"bank{attempt}")
        for spec in specs:
            bank.add_task(spec)
        floors.append(_forward_floor(sources, target_refs, bank))
        timers.snapshot_and_reset()
        start = time.perf_counter()
        counts = fill_bank(bank, sources, target_refs, progress=False)
        walls.append(time.perf_counter() - start)
        breakdown = timers.snapshot_and_reset()
    floors.append(_forward_floor(sources, target_refs, bank))
    wall, floor = statistics.median(walls), statistics.median(f["seconds"] for f in floors)
    return {
        "targets": n_targets,
        "sources": n_sources,
        "tasks": n_tasks,
        "probes": size["probes"],
        "wall_seconds": wall,
        "floor_seconds": floor,
        "ratio_to_floor": wall / floor,
        "wall_seconds_each": walls,
        "floor_seconds_each": [f["seconds"] for f in floors],
        "model_grid_pairs": floors[0]["model_grid_pairs"],
        "counts": dict(counts),
        "breakdown_seconds": {k: v["seconds"] for k, v in breakdown.items()},
        "_state": (bank, sources, target_refs),
    }


# -- 2. solve: cached factors vs recomputed ----------------------------------------------------------
def bench_solve(n: int, m: int, d: int, repeats: int = 5) -> dict:
    from ptc.compiler.method.ridge import factorize, solve_dense, solve_operator

    g = torch.Generator().manual_seed(0)
    inputs, rows = torch.randn(n, d, generator=g), torch.randn(m, d, generator=g)
    descriptor = torch.randn(n, m, generator=g, dtype=torch.float64) * 0.01
    factors = factorize(inputs, rows)
    cached = _median_seconds(lambda: solve_operator(factors, descriptor, 1.0), repeats * 4)
    recomputed = _median_seconds(
        lambda: solve_operator(factorize(inputs, rows), descriptor, 1.0), repeats
    )
    dense = _median_seconds(lambda: solve_dense(inputs, rows, descriptor, 1.0), repeats)
    return {
        "N": n,
        "M": m,
        "d": d,
        "cached_seconds": cached,
        "svd_per_operator_seconds": recomputed,
        "dense_inverse_seconds": dense,
        "speedup_vs_svd_per_operator": recomputed / cached,
        "speedup_vs_dense_inverse": dense / cached,
    }


# -- 3 and 5. compile on a warm bank, and the warm rebuild -------------------------------------------
def _recipe(
    folder: Path, bank, target_ref: str, n_terms: int, route: str = "closed_form", out: str = "out"
) -> Path:
    terms = [
        {"task": name, "source": sid, "weight": 0.5 / n_terms}
        for name in bank.task_names()
        for sid in bank.descriptor_ids(name)
    ][:n_terms]
    if len(terms) < n_terms:
        raise RuntimeError(f"the bench bank holds {len(terms)} descriptors, {n_terms} needed")
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"recipe-{route}-{n_terms}.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "target": target_ref,
                "terms": terms,
                "route": route,
                "bank": str(bank.root),
                "export": {"out": str(folder / out)},
            }
        )
    )
    return path


def _timed_build(recipe: Path, export: bool) -> tuple[float, dict]:
    """(seconds, this run's record: cache counts, timings, peak RSS, calls, and the route's report)"""
    from ptc import timers
    from ptc.compiler.build.pipeline import execute
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan

    options = Options(force=True, export=export, progress=False)
    timers.snapshot_and_reset()
    start = time.perf_counter()
    report = execute(plan(recipe, options), options)
    return time.perf_counter() - start, {
        **report.run,
        **report.route_report,
        "_calls": timers.snapshot_and_reset(),
    }


def bench_compile(root: Path, bank, target_ref: str, n_terms: int) -> dict:
    recipe = _recipe(root, bank, target_ref, n_terms)
    _timed_build(recipe, export=False)  # make sure the bank is warm for this recipe
    warm, report = _timed_build(recipe, export=False)
    exported, export_report = _timed_build(recipe, export=True)
    return {
        "terms": n_terms,
        "warm_no_export_seconds": warm,
        "warm_no_export_stages": report["timings"],
        "with_export_seconds": exported,
        "with_export_stages": export_report["timings"],
        "peak_rss_mb": export_report["peak_rss_mb"],
        "warm_rebuild": {
            "grid_embeddings_computed": report["cache"]["embeddings_computed"],
            "factors_computed": report["cache"]["factors_computed"],
            "operators_solved": report["cache"]["operators_solved"],
            # forward calls left are the torch verification's: base and edited on the check batch
            "forward_calls": report["_calls"].get("forward", {}).get("calls", 0),
            "probe_decode_calls": report["_calls"].get("decode_inputs", {}).get("calls", 0),
        },
        "_out": root / "out",
    }


# -- 4. zero-cost edit: ONNX latency -----------------------------------------------------------------
def bench_latency(root: Path, target_ref: str, out: Path, batch: int, repeats: int) -> dict:
    import onnxruntime as ort

    from ptc import targets
    from ptc.compiler.edit.lora import attach_lora
    from ptc.compiler.export.onnx_graph import export_onnx
    from ptc.targets.base import OnnxTower

    base = targets.load(target_ref)
    tower = base.onnx_towers()[0]
    export_onnx(tower, root / "base.onnx")
    # The alternative to merging: serve the LoRA unmerged (rank 16, as the adapter route).
    module = attach_lora(base, rank=16, alpha=16, seed=0, device=torch.device("cpu"))

    class Unmerged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = module

        def forward(self, pixel_values):
            return base.embed_with(self.inner, {"pixel_values": pixel_values})

    export_onnx(
        OnnxTower(
            "lora", Unmerged().eval(), tower.example_inputs, tower.output_name, tower.dynamic_axes
        ),
        root / "lora.onnx",
    )
    size = next(iter(tower.example_inputs.values())).shape[1:]
    feed = {
        next(iter(tower.example_inputs)): np.random.default_rng(0)
        .standard_normal((batch, *size))
        .astype(np.float32)
    }
    options = ort.SessionOptions()
    # One thread each: on a 2-core machine, two-thread sessions fight over the cores and the
    # noise swamps a 3% question.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    sessions = {
        name: ort.InferenceSession(str(path), options, providers=ort.get_available_providers())
        for name, path in (
            ("base", root / "base.onnx"),
            ("edited", out / "onnx" / "vision_model.onnx"),
            ("unmerged_lora", root / "lora.onnx"),
        )
    }
    for _ in range(20):  # warm-up: allocator arenas and caches settle
        for session in sessions.values():
            session.run(None, feed)
    times = {name: [] for name in sessions}
    names = list(sessions)
    for round_ in range(repeats):  # interleaved, rotating who goes first: drifts hit all alike
        for name in names[round_ % 3 :] + names[: round_ % 3]:
            start = time.perf_counter()
            sessions[name].run(None, feed)
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    # Per-round ratios, then their median: a slow moment of the machine hits all three runs of
    # a round alike and cancels out of the ratio.
    ratio = {
        name: statistics.median(t / b for t, b in zip(times[name], times["base"]))
        for name in sessions
    }
    return {
        "batch": batch,
        "repeats": repeats,
        "median_seconds": medians,
        "edited_over_base": ratio["edited"],
        "unmerged_lora_over_base": ratio["unmerged_lora"],
        "provider": sessions["edited"].get_providers()[0],
    }


# -- adapter route vs closed form ----------------------------------------------------------------------
def bench_routes(root: Path, bank, target_ref: str) -> dict:
    closed, _ = _timed_build(_recipe(root, bank, target_ref, 2, out="route-closed"), export=False)
    adapter, report = _timed_build(
        _recipe(root, bank, target_ref, 2, "adapter", out="route-adapter"), export=False
    )
    return {
        "terms": 2,
        "closed_form_build_seconds": closed,
        "adapter_build_seconds": adapter,
        "adapter_train_seconds": report["timings"].get("adapter_train"),
        "adapter_steps": report["adapter"]["steps"],
        "adapter_over_closed_form": adapter / closed,
    }


# -- 6. scaling -------------------------------------------------------------------------------------
def bench_scaling(root: Path, effort: Effort) -> dict:
    solve = {}
    grids = {"N": [250, 500, 1000, 2000], "M": [25, 50, 100, 200], "d": [128, 256, 512, 768]}
    base = {"n": 2000, "m": 200, "d": 256}
    repeats = min(3, effort.solve_repeats)
    for axis, grid in grids.items():
        values = grid[: effort.scaling_axis_points]
        rows = [bench_solve(**{**base, axis.lower(): value}, repeats=repeats) for value in values]
        solve[axis] = {
            "values": values,
            "cached_seconds": [r["cached_seconds"] for r in rows],
            "exponent": _exponent(values, [r["cached_seconds"] for r in rows]),
        }
    build: dict = {"N": list(effort.scaling_probes)}
    seconds = []
    for n in build["N"]:
        figures = bench_bank_build(
            Path(tempfile.mkdtemp(dir=root)), {**SIZES["tiny"], "probes": n}, 1, 1, 1
        )
        seconds.append(figures["wall_seconds"])
    build.update({"wall_seconds": seconds, "exponent": _exponent(build["N"], seconds)})
    return {"solve": solve, "bank_build_vs_probes": build}


# -- the whole run -----------------------------------------------------------------------------------
def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }


def run(effort_name: str, size_name: str, echo=print) -> dict:
    size, effort = SIZES[size_name], EFFORTS[effort_name]
    results: dict = {
        "machine": machine(),
        "effort": effort_name,
        "effort_config": asdict(effort),
        "size": size_name,
        "size_config": size,
    }
    spent: dict[str, float] = {}  # each section's seconds: where the bench's own time goes
    results["section_seconds"] = spent
    with tempfile.TemporaryDirectory(prefix="ptc-bench-") as tmp:
        root = Path(tmp)
        shape = effort.bank_shape
        echo(
            f"bank build: {shape[0]} targets x {shape[1]} sources x {shape[2]} tasks, size {size_name}"
        )
        with _section(spent, "bank_build"):
            bank_build = bench_bank_build(
                root / "bank-build", size, *shape, repeats=effort.bank_repeats
            )
        bank, sources, target_refs = bank_build.pop("_state")
        results["bank_build"] = bank_build
        echo("solve at N=2000, M=200, d=768 and at the bench grid")
        with _section(spent, "solve"):
            results["solve"] = {
                "paper_size": bench_solve(2000, 200, 768, effort.solve_repeats),
                "bench_grid": bench_solve(
                    size["probes"], size["classes"], size["embed_dim"], effort.solve_repeats
                ),
            }
        echo("compile: 8 terms on the warm bank")
        with _section(spent, "compile"):
            compile_ = bench_compile(root / "compile", bank, target_refs[0], 8)
        out = compile_.pop("_out")
        results["compile"] = compile_
        echo("zero-cost edit: ONNX latency")
        with _section(spent, "latency"):
            results["latency"] = bench_latency(
                root, target_refs[0], out, batch=8, repeats=effort.latency_repeats
            )
        echo("adapter route vs closed form")
        with _section(spent, "routes"):
            results["routes"] = bench_routes(root / "routes", bank, target_refs[0])
        echo("scaling")
        with _section(spent, "scaling"):
            results["scaling"] = bench_scaling(root, effort)
    return results


@contextmanager
def _section(spent: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    spent[name] = time.perf_counter() - start


def summary_rows(results: dict) -> list[tuple[str, str, str]]:
    """(figure, measured, target) rows for the printed table."""
    bank, solve, comp, lat = (
        results["bank_build"],
        results["solve"]["paper_size"],
        results["compile"],
        results["latency"],
    )
    scaling = results["scaling"]
    return [
        (
            "bank build / forward floor",
            f"{bank['ratio_to_floor']:.3f}x ({bank['wall_seconds']:.2f}s / {bank['floor_seconds']:.2f}s)",
            "<= 1.10x",
        ),
        (
            "cached solve speed-up (N=2000,M=200,d=768)",
            f"{solve['speedup_vs_svd_per_operator']:.0f}x vs SVD per op, "
            f"{solve['speedup_vs_dense_inverse']:.0f}x vs dense",
            ">= 20x",
        ),
        ("cached solve time", f"{solve['cached_seconds'] * 1e3:.2f} ms", "< 1 s"),
        ("warm compile, 8 terms, no export", f"{comp['warm_no_export_seconds']:.3f}s", "< 1 s"),
        ("compile with export", f"{comp['with_export_seconds']:.2f}s", ""),
        ("ONNX latency edited / base", f"{lat['edited_over_base']:.3f}", "1.00 +- 0.03"),
        ("ONNX latency unmerged LoRA / base", f"{lat['unmerged_lora_over_base']:.3f}", "> 1"),
        (
            "warm rebuild grid forward passes",
            str(comp["warm_rebuild"]["grid_embeddings_computed"]),
            "0",
        ),
        (
            "adapter / closed-form build",
            f"{results['routes']['adapter_over_closed_form']:.0f}x "
            f"({results['routes']['adapter_build_seconds']:.1f}s / "
            f"{results['routes']['closed_form_build_seconds']:.2f}s)",
            "",
        ),
        (
            "solve exponent in N, M, d",
            ", ".join(f"{scaling['solve'][a]['exponent']:.2f}" for a in "NMd"),
            "",
        ),
        ("bank build exponent in N", f"{scaling['bank_build_vs_probes']['exponent']:.2f}", "~1"),
    ]


def write(results: dict, path: Path) -> None:
    from ptc.files import write_json_atomic

    write_json_atomic(path, json.loads(json.dumps(results, default=str)))
