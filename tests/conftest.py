"""Shared fixtures: a tiny generated world, two tiny CLIPModels of different widths built
from configs (real tokenizer, saved with save_pretrained), LoRA sources trained here, a full
fine-tuned checkpoint, a bank, and one complete build that many tests inspect."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from ptc.lab.tiny import hf_clap, hf_clip, hf_siglip, openclip  # the tiny builders

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "2")


@dataclass
class World:
    root: Path
    tasks: dict[str, Path]  # task name -> task file
    source: Path  # tiny CLIP, width 32, d = 16
    target: Path  # tiny CLIP, width 48, d = 24
    adapters: dict[str, Path]  # task -> LoRA adapter folder on the source
    full_finetune: Path  # source with the colour adapter merged, saved natively
    bank: Path


# family -> (tiny builder, reference scheme for a saved folder[, probe modality]); a new family adds one row.
FAMILIES = {
    "hf-clip": (
        lambda folder, seed: hf_clip.build_tiny(folder, width=32, embed_dim=12, seed=seed),
        "hf:{}",
    ),
    "open_clip-vit": (
        lambda folder, seed: openclip.build_tiny(folder, width=32, embed_dim=20, seed=seed),
        "open_clip:local-dir:{}",
    ),
    "open_clip-vit-tiny-vocab": (
        lambda folder, seed: openclip.build_tiny(
            folder, width=32, embed_dim=20, seed=seed, vocab="tiny"
        ),
        "open_clip:local-dir:{}",
    ),
    "open_clip-eva02": (
        lambda folder, seed: openclip.build_tiny_timm(folder, embed_dim=24, seed=seed),
        "open_clip:local-dir:{}",
    ),
    "open_clip-resnet": (
        lambda folder, seed: openclip.build_tiny_resnet(folder, embed_dim=16, seed=seed),
        "open_clip:local-dir:{}",
    ),
    "hf-siglip": (lambda folder, seed: hf_siglip.build_tiny(folder, width=40, seed=seed), "hf:{}"),
    "hf-siglip2": (
        lambda folder, seed: hf_siglip.build_tiny2(folder, width=36, seed=seed),
        "hf:{}",
    ),
    "hf-clap": (
        lambda folder, seed: hf_clap.build_tiny(folder, embed_dim=20, seed=seed),
        "hf:{}",
        "audio",
    ),
}


def clip_pixels(paths, folder):
    """pixel_values for image files, by transformers' own CLIP processor saved in `folder`."""
    from PIL import Image
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor.from_pretrained(folder)
    return processor(images=[Image.open(p).convert("RGB") for p in paths], return_tensors="pt")[
        "pixel_values"
    ]


def run_card_snippets(out: Path, expected_texts) -> int:
    """Run every Python block of an output's model card as written, in the output folder, each
    in a fresh interpreter; a block that makes `text_embeds` must give `expected_texts` (the
    edited model's, for the card's two prompts) to 1e-5. Returns how many blocks ran."""
    import re

    import numpy as np

    blocks = re.findall(r"```python\n(.*?)```", (out / "README.md").read_text(), re.S)
    for index, block in enumerate(blocks):
        saved = out.parent / f"snippet-{index}.npy"
        probe = f"\nimport numpy\nnumpy.save({str(saved)!r}, numpy.asarray(text_embeds))\n"
        code = block + (probe if "text_embeds =" in block else "")
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=out, capture_output=True, text=True
        )
        assert result.returncode == 0, f"{block}\n{result.stderr[-2000:]}"
        if "text_embeds =" in block:
            assert np.abs(np.load(saved) - np.asarray(expected_texts)).max() <= 1e-5, block
    return len(blocks)


def tree_digest(root: Path, pattern: str = "*") -> dict[str, str]:
    """sha256 of every file under `root` matching `pattern`, by relative path."""
    import hashlib

    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(Path(root).rglob(pattern))
        if p.is_file()
    }


def run_ptc(*args, cwd=None, env=None, in_process=True):
    """Run the real CLI; returns a CompletedProcess (returncode, stdout, stderr as text).

    In this process through click's runner by default: a fresh interpreter spends seconds
    importing torch, transformers and open_clip before each command, and the suite runs dozens
    of commands. `in_process=False` (or PTC_TEST_SUBPROCESS=1 for the whole suite) runs it the
    way a user does, in a subprocess."""
    argv = [str(arg) for arg in args]
    if not in_process or os.environ.get("PTC_TEST_SUBPROCESS") == "1":
        return subprocess.run(
            [sys.executable, "-m", "ptc.compiler.cli", *argv],
            cwd=cwd or REPO,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
            timeout=600,
        )
    from click.testing import CliRunner

    from ptc.compiler.cli.main import main

    with contextlib.chdir(cwd or REPO):
        result = CliRunner(env=env).invoke(main, argv, prog_name="ptc")
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        # Uncaught (--debug re-raises): what the interpreter would print, and its exit code 1.
        stderr += "".join(traceback.format_exception(result.exception))
    return subprocess.CompletedProcess(["ptc", *argv], result.exit_code, result.stdout, stderr)


def _lora_sources(
    bank, tasks: dict[str, Path], encoder, folder: Path, steps: int
) -> dict[str, Path]:
    """Register each task, fine-tune a LoRA source on its train split, add its descriptor as 'src'."""
    from ptc.compiler.sources.descriptor import add_descriptor
    from ptc.compiler.sources.finetune import finetune_lora
    from ptc.compiler.tasks.grid import load_task

    adapters = {}
    for name, task_file in tasks.items():
        record, _ = bank.add_task(load_task(task_file))
        adapters[name] = folder / name
        finetune_lora(
            encoder, record, task_file.parent / "train", adapters[name], steps=steps, progress=False
        )
        add_descriptor(bank, name, encoder.ref, str(adapters[name]), "src", progress=False)
    return adapters


@pytest.fixture(scope="session")
def zoo(tmp_path_factory) -> Path:
    """The zoo built with the tiny profile (its members, sources and bank), built once."""
    from ptc.lab.zoo.build import build_zoo, profile_named

    root = tmp_path_factory.mktemp("zoo")
    build_zoo(root, profile_named("tiny"), echo=lambda _: None)
    return root


@pytest.fixture(scope="session")
def world(tmp_path_factory) -> World:
    from ptc import targets
    from ptc.compiler.bank.store import Bank
    from ptc.compiler.sources.descriptor import add_descriptor
    from ptc.lab.demo import write_world
    from ptc.lab.tiny.hf_clip import build_tiny

    root = tmp_path_factory.mktemp("world")
    tasks = write_world(root / "world", probes=16, train=8, test=6)
    source = build_tiny(root / "models" / "source", width=32, embed_dim=16, seed=1)
    target = build_tiny(root / "models" / "target", width=48, embed_dim=24, seed=2)
    bank = Bank(root / "bank")
    encoder = targets.load(f"hf:{source}")
    adapters = _lora_sources(bank, tasks, encoder, root / "adapters", steps=12)
    full = root / "models" / "source-colour-full"
    encoder.with_adapter(adapters["colour"]).save_native(full)
    add_descriptor(bank, "colour", f"hf:{source}", f"hf:{full}", "full", progress=False)
    return World(root, tasks, source, target, adapters, full, bank.root)


@dataclass
class AudioWorld:
    tasks: dict[str, Path]  # task name -> task file (waveform, pitch)
    source: Path  # tiny CLAP, d = 16, one Swin stage of depth 1 (width 16)
    adapters: dict[str, Path]  # task -> LoRA adapter on the source's audio tower
    bank: Path


@pytest.fixture(scope="session")
def audio_world(tmp_path_factory) -> AudioWorld:
    from ptc import targets
    from ptc.compiler.bank.store import Bank
    from ptc.lab.demo import write_audio_world
    from ptc.lab.tiny.hf_clap import build_tiny

    root = tmp_path_factory.mktemp("audio")
    tasks = write_audio_world(root / "world")
    source = build_tiny(root / "models" / "source", embed_dim=16, depths=(1,), seed=1)
    bank = Bank(root / "bank")
    adapters = _lora_sources(bank, tasks, targets.load(f"hf:{source}"), root / "adapters", steps=10)
    return AudioWorld(tasks, source, adapters, bank.root)


def built_key(model, report: dict) -> str:
    """The bank key a build kept its target's entries under: the model's, with the runtime that
    its report says made the grids' embeddings (onnxruntime where the build wrote ONNX)."""
    from ptc.compiler.embed import model_key

    runtimes = {made["runtime"] for made in report["embeddings"].values()}
    assert len(runtimes) == 1, runtimes
    return model_key(model, runtimes.pop())


def write_recipe(path: Path, world: World, terms=None, **overrides) -> Path:
    recipe = {
        "target": f"hf:{world.target}",
        "terms": terms
        or [
            {"task": "colour", "source": "src", "weight": 0.5},
            {"task": "shape", "source": "src", "weight": -1.0},
        ],
        "bank": str(world.bank),
        "export": {"out": str(path.parent / "out")},
    }
    recipe.update(overrides)
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture(scope="session")
def built(world, tmp_path_factory):
    """One real `ptc build` through the CLI; returns (output folder, completed process)."""
    folder = tmp_path_factory.mktemp("build")
    recipe = write_recipe(folder / "recipe.yaml", world)
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    return folder / "out", result


@pytest.fixture()
def bank_copy(world, tmp_path) -> Path:
    """A private copy of the session bank for tests that damage or extend it."""
    copy = tmp_path / "bank"
    shutil.copytree(world.bank, copy)
    return copy
