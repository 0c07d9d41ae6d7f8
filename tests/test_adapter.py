"""The adapter route and `ptc finetune` on tiny models."""

import json

import torch
from safetensors.torch import load_file

from conftest import run_ptc, write_recipe
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.sources.finetune import finetune_lora
from ptc.compiler.verify.evaluate import zero_shot_accuracy

FAST = {"rank": 4, "max_steps": 60, "lr": 1.0e-2, "batch_size": 16}


def test_adapter_route_fits_the_descriptors_better_than_the_closed_form(world, built, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world, route="adapter", adapter=FAST)
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    report = json.loads((out / "report.json").read_text())
    closed = json.loads((built[0] / "report.json").read_text())
    assert report["route"] == "adapter" and report["verify"]["linearity"] is None
    residuals, closed_residuals = (
        report["verify"]["descriptor_residual"],
        closed["verify"]["descriptor_residual"],
    )
    # On these untrained models the closed form leaves about all of each descriptor (residual
    # near 1.0, what no edit leaves); the adapter, trained on the same targets, fits every task
    # better and each by a clear margin.
    for task, residual in residuals.items():
        assert residual < 0.9 and residual < closed_residuals[task], (
            task,
            residuals,
            closed_residuals,
        )
    for figure in ("torch_max_abs_diff", "onnx_max_abs_diff", "reload_max_abs_diff"):
        assert report["verify"]["equivalence"][figure] <= 1e-5
    # 16 probes per grid in batches of 16: one step per epoch, 20 epochs, under the 60-step cap.
    assert report["adapter"]["steps"] == 20
    # Merged: the export has exactly the base model's tensors, and only vision q/v changed.
    base = load_file(world.target / "model.safetensors")
    edited = load_file(out / "model" / "model.safetensors")
    assert set(edited) == set(base)
    changed = {k for k in base if not torch.equal(base[k], edited[k])}
    assert changed and all(
        "vision_model" in k and (".q_proj." in k or ".v_proj." in k) for k in changed
    )
    lock = json.loads((out / "ptc.lock").read_text())
    assert lock["edit"]["route"] == "adapter" and len(lock["edit"]["adapter"]["sha256"]) == 64


def test_adapter_residual_threshold_fails_the_build(world, tmp_path):
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        world,
        route="adapter",
        adapter={**FAST, "max_steps": 2},
        verify={"max_descriptor_residual": 1.0e-3},
    )
    result = run_ptc("build", recipe)
    assert (
        result.returncode == 3
        and "descriptor residual" in result.stderr
        and "1.0e-03" in result.stderr
    )
    assert not (tmp_path / "out").exists()


def test_finetune_raises_accuracy_and_is_deterministic(world, tmp_path):
    task = Bank(world.bank).task("colour")
    data = world.tasks["colour"].parent / "train"
    source = targets.load(f"hf:{world.source}")
    before = zero_shot_accuracy(source, task, data, progress=False)["accuracy"]
    runs = {}
    for name, seed in (("a", 7), ("b", 7), ("c", 8)):
        finetune_lora(source, task, data, tmp_path / name, steps=80, seed=seed, progress=False)
        runs[name] = load_file(tmp_path / name / "adapter_model.safetensors")
    after = zero_shot_accuracy(source.with_adapter(tmp_path / "a"), task, data, progress=False)[
        "accuracy"
    ]
    assert after >= before + 0.25, (before, after)
    assert all(torch.equal(runs["a"][k], runs["b"][k]) for k in runs["a"])
    assert not all(torch.equal(runs["a"][k], runs["c"][k]) for k in runs["a"])
    assert all("vision_model" in k for k in runs["a"])  # the text tower stays frozen


def test_ctrl_c_during_finetune_leaves_nothing(world, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "lora"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ptc.compiler.cli",
            "finetune",
            "--task",
            "colour",
            "--source",
            f"hf:{world.source}",
            "--data",
            world.tasks["colour"].parent / "train",
            "--out",
            out,
            "--steps",
            "100000",
            "--bank",
            world.bank,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # A runner started in the background (nohup ... &) passes SIGINT on
        # as ignored; a terminal user's ptc has it at its default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Wait for training to begin (on a loaded machine loading can take any time), then press Ctrl-C.
    before = []  # library warnings may come first
    while not (line := process.stderr.readline()).startswith("training:"):
        assert line, "".join(before)  # the process ended before training began
        before.append(line)
    time.sleep(1)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == 130, stderr
    assert "interrupted; nothing was written" in stderr
    assert not out.exists() and not list(tmp_path.iterdir())
