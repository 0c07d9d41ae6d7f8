"""`ptc bench --size vit-b16`: a build at a real architecture's size, against its floors.

The target is a random-weight model of the named public architecture with a tokenizer of the
real vocabulary (lab/real_size.py: transformers CLIP and SigLIP, open_clip ViT-H/14 and EVA02-L);
the source is a transformers CLIP of another size with a random rank-4 LoRA as its fine-tune. Everything runs as a user runs it, through the `ptc`
command, and every figure is a ratio of two things measured here, in this run:

- the forward floor on each runtime the machine has, side by side: decoding the grid's probes
  and the forward passes over them and its prompts, which no build can avoid, in torch eager
  fp32, onnxruntime fp32 (the base export) and torch bf16 autocast, with images per second and
  the GFLOP/s they achieve;
- cold build (empty embedding and export caches) over the fastest fp32 floor, its embed stage
  over that floor, and everything but the embed stage and the one-time base export over the
  embed stage; the base export beside a plain export of the same tower;
- warm rebuild (a new strength: nothing to embed or solve, one matrix changes) over its own
  floor: loading the target, writing the output's bytes, and the verification passes it must
  run (the check batch through the edited model, its ONNX graph and the reloaded checkpoint);
- each build's peak resident memory over the target checkpoint's bytes;
- the edited ONNX tower against a fresh export of the edited model (largest output difference),
  and the edited graph's latency over the base graph's.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import yaml


@dataclass(frozen=True)
class Size:
    """One benchmark: the target and source architectures (lab/real_size.NAMES), the grid, how
    many inputs time the bf16 rate, and the warm rebuild's goal in seconds."""

    target: str
    source: str
    probes: int
    classes: int
    bf16_inputs: int = 16
    warm_rebuild_seconds: float = 15.0


# ViT-L/14 embeds at about 1 image/s on 2 cores: 96 probes keep its run near a quarter of an
# hour. The largest towers get fewer probes, and ten classes, for the same reason: a ViT-H/14
# prompt is about 55 GFLOP (354M text parameters x 77 tokens x 2), more than a ViT-B/16 image
# (34), and an so400m image about 0.6 TFLOP (729 patches at 384 px). bf16 without bf16
# instructions runs at a sixth of fp32.
SIZES = {
    "vit-tiny16": Size("vit-tiny16", "vit-tiny32", 384, 50),
    "vit-b16": Size("vit-b16", "vit-b32", 384, 50, warm_rebuild_seconds=10.0),
    "vit-l14": Size("vit-l14", "vit-b16", 96, 50, warm_rebuild_seconds=20.0),
    "eva02-l14": Size("eva02-l14", "vit-b16", 64, 10, bf16_inputs=4),
    "siglip-so400m": Size("siglip-so400m", "vit-b16", 24, 10, bf16_inputs=2),
    "vit-h14": Size("vit-h14", "vit-b16", 32, 10, bf16_inputs=4),
}
TEMPLATES = ["a photo of a {}.", "an image of {}."]
GOALS = {
    "cold_build_ratio": 1.25,
    "embed_over_fastest_fp32_floor": 1.1,
    "non_embed_over_embed": 0.15,
    "warm_rebuild_ratio": 2.0,
    "peak_rss_over_model_bytes": 2.0,
    "export_max_abs_diff": 1e-6,
}


def _write_task(folder: Path, probes: int, classes: int, image_size: int = 224) -> Path:
    from PIL import Image

    rng = np.random.default_rng(0)
    (folder / "probes").mkdir(parents=True, exist_ok=True)
    for i in range(probes):
        Image.fromarray(rng.integers(0, 256, (image_size, image_size, 3), dtype=np.uint8)).save(
            folder / "probes" / f"{i:05d}.png"
        )
    spec = {
        "name": "bench",
        "probes": "probes",
        "classes": [f"object {c}" for c in range(classes)],
        "templates": TEMPLATES,
    }
    (folder / "task.yaml").write_text(yaml.safe_dump(spec))
    return folder / "task.yaml"


def _run(args: list[str]) -> tuple[float, str]:
    """Wall seconds and stdout of a command run as a user runs it. (Its peak memory is read from
    the build's own run.json: wait4's maxrss keeps the parent's size at fork across exec.)"""
    start = time.perf_counter()
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(
            f"{' '.join(args[2:])} failed ({result.returncode}): {result.stderr[-2000:]}"
        )
    return time.perf_counter() - start, result.stdout


def ptc(*args: str) -> dict:
    seconds, out = _run([sys.executable, "-m", "ptc.compiler.cli", *args])
    return {"seconds": seconds, "stdout": out}


def _recipe(path: Path, target: str, bank: Path, weight: float) -> Path:
    spec = {
        "target": target,
        "bank": str(bank),
        "terms": [{"task": "bench", "source": "source", "weight": weight}],
        "export": {"out": "out", "formats": ["onnx", "safetensors"]},
    }
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _forward_floors(
    target_ref: str, task_file: Path, base_export: Path, bf16_inputs: int, batch_size: int = 64
) -> dict[str, dict[str, float]]:
    """The grid's embedding with the model loaded, on each runtime: decoding the probes and the
    forward passes over them and the prompts, in the batches and runs a build takes
    (compiler/embed.py `in_runs`), one after the other; the input passes alone give images/s
    and, with the tower's FLOPs per image, GFLOP/s. Prompts run on torch fp32 in every row, as
    a build runs them."""
    from ptc import targets
    from ptc.compiler.embed import in_runs
    from ptc.compiler.export.onnx_embed import session_forward
    from ptc.devices import CPU, autocast, place

    spec = yaml.safe_load(task_file.read_text())
    paths = sorted((task_file.parent / "probes").glob("*.png"))
    prompts = [t.format(c) for c in spec["classes"] for t in spec["templates"]]
    model = targets.load(target_ref)
    flops = _flops_per_input(model, paths[0])
    onnx = session_forward(base_export)
    # bf16 is timed on a few inputs: it is a rate here, not a floor (no fp32 ratio uses it), and
    # a CPU without bf16 instructions runs it many times slower than fp32.
    runtimes = {
        "torch_fp32": (model.embed_inputs, "fp32", paths),
        "onnxruntime_fp32": (lambda batch: onnx(batch)[0], "fp32", paths),
        "torch_bf16": (model.embed_inputs, "bf16", paths[:bf16_inputs]),
    }
    floors = {}
    for name, (forward, precision, timed) in runtimes.items():
        place(model, CPU, precision)
        with torch.inference_mode(), autocast(model):
            forward(model.load_inputs(paths[:2]))  # warm-up: first-call allocations, kernels
        start, passes = time.perf_counter(), 0.0
        runs = in_runs(model, forward)
        for i in range(0, len(timed), batch_size):
            batch = model.load_inputs(timed[i : i + batch_size])
            began = time.perf_counter()
            with torch.inference_mode(), autocast(model):
                runs(batch)
            passes += time.perf_counter() - began
        place(model, CPU, "fp32")
        model.embed_prompts(prompts)
        floors[name] = {
            "seconds": time.perf_counter() - start,
            "inputs_timed": len(timed),
            "input_pass_seconds": passes,
            "images_per_second": len(timed) / passes,
            "gflops_per_second": flops * len(timed) / passes / 1e9,
        }
    return floors


def _flops_per_input(model, path: Path) -> float:
    """FLOPs of one input's pass through the input tower, as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    batch = model.load_inputs([path])
    with FlopCounterMode(display=False) as counter, torch.inference_mode():
        model.embed_inputs(batch)
    return float(counter.get_total_flops())


LOAD_TARGET = "import sys; from ptc import targets; targets.load(sys.argv[1])"
# The library a scheme's loader imports beyond these (open_clip brings timm).
SCHEME_LIBRARIES = {"hf": "transformers", "open_clip": "open_clip"}
IMPORT_LIBRARIES = (
    "import ptc.compiler.build.pipeline, ptc.compiler.cli.main, onnx, onnxruntime, transformers; "
    "import {library}; "
    "from transformers import CLIPModel, CLIPTokenizer, CLIPImageProcessor; "
    "from ptc.compiler.build.report import peak_rss_mb; print(peak_rss_mb())"
)


def _process(code: str, *args: str) -> tuple[float, str]:
    """Wall seconds and output of a fresh interpreter running `code`."""
    return _run([sys.executable, "-c", code, *args])


def _own_floor(target_ref: str, out: Path, check_inputs: int) -> dict:
    """What a warm rebuild cannot avoid: a process that imports the libraries and loads the
    target, writing the output's bytes, and one pass of the check batch through the edited
    model, its ONNX graph and (4 inputs) the reload."""
    from ptc import targets
    from ptc.compiler.export.onnx_run import run_onnx

    parts = {"start_and_load": _process(LOAD_TARGET, target_ref)[0]}
    model = targets.load(target_ref)
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    chunk = os.urandom(1 << 24)
    with tempfile.NamedTemporaryFile(dir=out.parent) as handle:
        start = time.perf_counter()
        for _ in range(size // len(chunk) + 1):
            handle.write(chunk)
        handle.flush()
        os.fsync(handle.fileno())
        parts["write_outputs"] = time.perf_counter() - start
    paths = sorted(out.parent.glob("task/probes/*.png"))[:check_inputs]
    batch = model.load_inputs(paths)
    start = time.perf_counter()
    model.embed_inputs(batch)
    parts["check_torch"] = time.perf_counter() - start
    start = time.perf_counter()
    run_onnx(out / "onnx" / "vision_model.onnx", batch)
    parts["check_onnx"] = time.perf_counter() - start
    start = time.perf_counter()
    model.embed_inputs({k: v[:4] for k, v in batch.items()})
    parts["check_reload"] = time.perf_counter() - start
    return {"seconds": sum(parts.values()), "parts": parts, "output_bytes": size}


def _export_check(out: Path, bank: Path, probes: list[Path]) -> dict:
    """The shipped (patched) vision graph against a fresh export of the edited checkpoint, and
    its latency against the base graph's."""
    from ptc import targets
    from ptc.compiler.export.onnx_graph import export_onnx
    from ptc.compiler.export.onnx_run import run_onnx

    edited = targets.load(_native_ref(out))
    batch = edited.load_inputs(probes[:8])
    plain: dict[str, float] = {}  # each tower's plain export: the one-time base export's floor
    towers = edited.onnx_towers()
    with tempfile.TemporaryDirectory() as folder:
        for tower in towers:
            start = time.perf_counter()
            export_onnx(tower, Path(folder) / f"{tower.name}.onnx")
            plain[tower.name] = time.perf_counter() - start
        vision = towers[0].name
        fresh, _ = run_onnx(Path(folder) / f"{vision}.onnx", batch)
    shipped, _ = run_onnx(out / "onnx" / "vision_model.onnx", batch)
    base = next(bank.glob("exports/*/vision_model.onnx"))
    return {
        "max_abs_diff_vs_fresh_export": float(np.abs(shipped - fresh).max()),
        "fresh_export_seconds": plain[vision],
        "plain_export_seconds_by_tower": plain,
        "edited_over_base_latency": _latency(out / "onnx" / "vision_model.onnx", batch)
        / _latency(base, batch),
    }


def _latency(path: Path, batch, repeats: int = 5) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {k: v.numpy() for k, v in batch.items()}
    session.run(None, feeds)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _adapter(source_ref: str, folder: Path) -> Path:
    from ptc import targets
    from ptc.lab.benchmarks.suite import _random_adapter

    return _random_adapter(targets.load(source_ref), folder, seed=1)


def _native_ref(out: Path) -> str:
    """The reference that loads a build's saved checkpoint: its report's, relative to `out`."""
    scheme, _, folder = json.loads((out / "report.json").read_text())["native_ref"].rpartition(":")
    return f"{scheme}:{out / folder}"


def run(size_name: str, echo=print, probes: int | None = None) -> dict:
    """The whole benchmark at `size_name`; `probes` overrides the grid's size (tests)."""
    from ptc.lab.real_size import build

    size = SIZES[size_name]
    target_arch, source_arch, classes = size.target, size.source, size.classes
    probes = probes or size.probes
    with tempfile.TemporaryDirectory(prefix="ptc-bench-") as folder:
        root = Path(folder)
        echo(
            f"building {target_arch} target and {source_arch} source (random weights, real configs)"
        )
        target = build(root / "target", target_arch, seed=0)
        source = build(root / "source", source_arch, seed=1)
        adapter = _adapter(source.ref, root / "source-lora")
        task_file = _write_task(root / "task", probes, classes)
        bank = root / "bank"
        ptc("task", "add", str(task_file), "--bank", str(bank))
        echo(
            f"descriptor: {probes} probes x {classes * len(TEMPLATES)} prompts through the source and its fine-tune"
        )
        descriptor = ptc(
            "descriptor",
            "add",
            "--task",
            "bench",
            "--source",
            source.ref,
            "--finetuned",
            str(adapter),
            "--id",
            "source",
            "--bank",
            str(bank),
        )
        recipe = _recipe(root / "recipe.yaml", target.ref, bank, 1.0)
        echo("cold build")
        cold = ptc("build", str(recipe))
        cold_record = json.loads((root / "out" / "run.json").read_text())
        echo("forward floors: torch fp32, onnxruntime fp32, torch bf16")
        base_export = next(bank.glob("exports/*/vision_model.onnx"))
        floors = _forward_floors(target.ref, task_file, base_export, size.bf16_inputs)
        fastest = min(("torch_fp32", "onnxruntime_fp32"), key=lambda n: floors[n]["seconds"])
        floor = floors[fastest]["seconds"]
        # its own (VmHWM), not wait4's
        cold["peak_rss_bytes"] = int(cold_record["peak_rss_mb"] * 2**20)
        # what `--embed-runtime auto` measured on its first build here (none where it had no
        # choice: an edit inside the tower embeds on torch)
        measured = [json.loads(p.read_text()) for p in sorted(bank.glob("runtimes/*.json"))]
        _recipe(recipe, target.ref, bank, 0.5)
        echo("warm rebuild")
        warm = ptc("build", str(recipe), "--force")
        run_record = json.loads((root / "out" / "run.json").read_text())
        warm["peak_rss_bytes"] = int(run_record["peak_rss_mb"] * 2**20)
        report = json.loads((root / "out" / "report.json").read_text())
        own = _own_floor(target.ref, root / "out", report["verify"]["equivalence"]["check_inputs"])
        echo("fresh export of the edited model")
        export = _export_check(root / "out", bank, sorted((root / "task" / "probes").glob("*.png")))
        echo("cold build on the cached base exports")
        for cache in ("embeddings", "factors", "operators"):  # the exports stay
            shutil.rmtree(bank / cache)
        recold = ptc("build", str(recipe), "--force")
        recold_record = json.loads((root / "out" / "run.json").read_text())
        model_bytes = target.weights.stat().st_size
        library = SCHEME_LIBRARIES[target.ref.partition(":")[0]]
        imported = _process(IMPORT_LIBRARIES.format(library=library))[1]
        libraries_rss = int(float(imported.split()[-1]) * 2**20)
    return {
        "machine": machine(),
        "size": size_name,
        "target": target_arch,
        "source": source_arch,
        "probes": probes,
        "prompts": classes * len(TEMPLATES),
        "model_bytes": model_bytes,
        "forward_floor_seconds": floor,
        "forward_floor_runtime": fastest,
        "forward_floors": floors,
        "descriptor_add_seconds": descriptor["seconds"],
        "cold_build": {
            "seconds": cold["seconds"],
            "ratio_to_forward_floor": cold["seconds"] / floor,
            "embed_over_fastest_fp32_floor": cold_record["timings"]["embed"] / floor,
            "non_embed_over_embed": _non_embed(cold["seconds"], cold_record["timings"]),
            "export_base_seconds": cold_record["timings"].get("export_base", 0.0),
            # once per model and machine, as the base export: `auto` timing both runtimes
            "measure_runtime_seconds": cold_record["timings"].get("measure_runtime", 0.0),
            # every tower's, as the build's export_base stage holds each one's first export
            "plain_export_seconds": sum(export["plain_export_seconds_by_tower"].values()),
            "runtime": report["embeddings"]["bench"]["runtime"],
            "runtime_measured": [
                {k: m[k] for k in ("images_per_second", "inputs", "chosen")} for m in measured
            ],
            "peak_rss_bytes": cold["peak_rss_bytes"],
            "peak_rss_mb_by_stage": cold_record.get("peak_rss_mb_by_stage"),
            "stages": cold_record["timings"],
            "cache": cold_record["cache"],
        },
        # The same, with the base exports cached (a model built before): all but the embed stage,
        # over that stage; here opening the cached export for onnxruntime counts as overhead.
        "cold_build_cached_export": {
            "seconds": recold["seconds"],
            "embed_over_fastest_fp32_floor": recold_record["timings"]["embed"] / floor,
            "non_embed_over_embed": (recold["seconds"] - recold_record["timings"]["embed"])
            / recold_record["timings"]["embed"],
            "peak_rss_bytes": int(recold_record["peak_rss_mb"] * 2**20),
            "peak_rss_mb_by_stage": recold_record.get("peak_rss_mb_by_stage"),
            "stages": recold_record["timings"],
            "cache": recold_record["cache"],
        },
        "warm_rebuild": {
            "seconds": warm["seconds"],
            "own_floor_seconds": own["seconds"],
            "own_floor_parts": own["parts"],
            "ratio_to_own_floor": warm["seconds"] / own["seconds"],
            "output_bytes": own["output_bytes"],
            "peak_rss_bytes": warm["peak_rss_bytes"],
            "peak_rss_mb_by_stage": run_record.get("peak_rss_mb_by_stage"),
            "stages": run_record["timings"],
            "cache": run_record["cache"],
        },
        # Peak RSS above what the libraries alone hold once imported (torch, transformers, onnx,
        # onnxruntime: ~0.85 GB here, a model's size), over the model's bytes; and the total.
        "libraries_rss_bytes": libraries_rss,
        "peak_rss_over_model_bytes": (_peak(cold, warm, recold_record) - libraries_rss)
        / model_bytes,
        "peak_rss_total_over_model_bytes": _peak(cold, warm, recold_record) / model_bytes,
        "export": export,
        "goals": {**GOALS, "warm_rebuild_seconds": size.warm_rebuild_seconds},
        "verification": report["verify"]["equivalence"],
    }


def _peak(cold: dict, warm: dict, recold_record: dict) -> int:
    return max(
        cold["peak_rss_bytes"], warm["peak_rss_bytes"], int(recold_record["peak_rss_mb"] * 2**20)
    )


def _peak_stages(results: dict) -> str:
    """Per build, the stage that held its peak and that peak (run.json's per-stage record)."""
    parts = []
    for build in ("cold_build", "cold_build_cached_export", "warm_rebuild"):
        stages = results[build].get("peak_rss_mb_by_stage") or {}
        if stages:
            stage = max(stages, key=stages.get)
            parts.append(f"{build.replace('_', ' ')}: {stage} {stages[stage] / 1024:.2f} GB")
    return "; ".join(parts) or "not measured here"


def _non_embed(seconds: float, timings: dict[str, float]) -> float:
    """Everything a cold build did but embed, export the base graph it embeds with and time the
    runtimes (each once per model), over its embed stage: what the build adds to the forward
    passes it cannot avoid."""
    once = timings.get("export_base", 0.0) + timings.get("measure_runtime", 0.0)
    return (seconds - timings["embed"] - once) / timings["embed"]


def machine() -> dict:
    from ptc.devices import cpu_name

    return {
        "cpu": cpu_name(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def summary_rows(results: dict) -> list[tuple[str, str, str]]:
    cold, warm, export = results["cold_build"], results["warm_rebuild"], results["export"]
    goals = results["goals"]
    runtimes = [
        (
            f"input passes, {name.replace('_', ' ')}",
            f"{floor['images_per_second']:.2f} images/s, {floor['gflops_per_second']:.0f} GFLOP/s",
            "",
        )
        for name, floor in results["forward_floors"].items()
    ]
    return [
        *runtimes,
        (
            "cold build / fastest fp32 forward floor",
            f"{cold['ratio_to_forward_floor']:.2f}x "
            f"({cold['seconds']:.1f} s / {results['forward_floor_seconds']:.1f} s, "
            f"{results['forward_floor_runtime'].replace('_', ' ')})",
            f"<= {goals['cold_build_ratio']}x",
        ),
        (
            f"embed stage ({cold['runtime']}) / that floor",
            f"{cold['embed_over_fastest_fp32_floor']:.2f}x",
            f"<= {goals['embed_over_fastest_fp32_floor']}x",
        ),
        (
            "cold build but embed and base export / embed stage",
            f"{cold['non_embed_over_embed']:.2f}",
            f"<= {goals['non_embed_over_embed']}",
        ),
        (
            "cold build on cached exports: all but embed / embed stage",
            f"{results['cold_build_cached_export']['non_embed_over_embed']:.2f} "
            f"({results['cold_build_cached_export']['seconds']:.1f} s)",
            f"<= {goals['non_embed_over_embed']}",
        ),
        (
            "one-time base export / a plain export of the towers",
            f"{cold['export_base_seconds']:.1f} s / {cold['plain_export_seconds']:.1f} s",
            "",
        ),
        ("warm rebuild", f"{warm['seconds']:.1f} s", f"<= {goals['warm_rebuild_seconds']:.0f} s"),
        (
            "warm rebuild / own floor",
            f"{warm['ratio_to_own_floor']:.2f}x ({warm['own_floor_seconds']:.1f} s)",
            f"<= {goals['warm_rebuild_ratio']}x",
        ),
        (
            "peak RSS above libraries / model bytes",
            f"{results['peak_rss_over_model_bytes']:.2f}x "
            f"({results['model_bytes'] / 1e6:.0f} MB model; total {results['peak_rss_total_over_model_bytes']:.2f}x)",
            f"<= {goals['peak_rss_over_model_bytes']}x",
        ),
        ("stage of each build's peak RSS", _peak_stages(results), ""),
        (
            "patched ONNX vs fresh export",
            f"{export['max_abs_diff_vs_fresh_export']:.1e} max abs",
            f"<= {goals['export_max_abs_diff']:.0e}",
        ),
        ("edited / base ONNX latency", f"{export['edited_over_base_latency']:.2f}x", "~1.0x"),
    ]
