"""--device and --precision: device selection and its errors, reduced-precision embeddings kept
apart from fp32 ones in the bank, and the report and lock saying what made each embedding.
(The CUDA path itself needs a GPU; what a CPU can check is checked here.)"""

from __future__ import annotations

import json

import pytest
import torch

from conftest import run_ptc, write_recipe
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.embed import embed_grid, model_info, model_key
from ptc.devices import Compute, cpu_name, precision_of, resolve_device
from ptc.errors import InputError


def test_device_selection_and_its_errors(monkeypatch):
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(InputError, match=r"--device cuda:1: this machine has 0 CUDA device\(s\)"):
        resolve_device("cuda:1")
    with pytest.raises(InputError, match="--device cuda: this machine has 0"):
        resolve_device("cuda")
    for typo in ("tpu", "gpu", "cuda:x", ""):
        with pytest.raises(InputError, match="expected auto, cpu, cuda or cuda:N"):
            resolve_device(typo)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda") and resolve_device(
        "cuda:1"
    ) == torch.device("cuda:1")
    with pytest.raises(InputError, match="this machine has 2 CUDA device"):
        resolve_device("cuda:2")


def test_a_missing_device_is_refused_before_anything_runs(world, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    for command in (
        ["build", recipe],
        [
            "descriptor",
            "add",
            "--task",
            "colour",
            "--source",
            f"hf:{world.source}",
            "--finetuned",
            world.adapters["colour"],
            "--bank",
            world.bank,
        ],
        [
            "eval",
            f"hf:{world.target}",
            "--task",
            "colour",
            "--data",
            world.root,
            "--bank",
            world.bank,
        ],
    ):
        result = run_ptc(*command, "--device", "cuda:64")
        assert result.returncode == 2, result.stderr
        assert (
            result.stderr.startswith("ptc: error: --device cuda:64: this machine has")
            and result.stderr.count("\n") <= 2
        ), result.stderr
    assert not (tmp_path / "out").exists()
    bad = run_ptc("build", recipe, "--precision", "fp8")
    assert bad.returncode == 2 and "'fp8' is not one of 'fp32', 'bf16', 'fp16'" in bad.stderr


def test_reduced_precision_embeddings_are_cached_apart_and_say_what_made_them(world, bank_copy):
    bank = Bank(bank_copy)
    task = bank.task("colour")
    fp32 = targets.load(f"hf:{world.target}")
    half = Compute("cpu", "bf16").place(targets.load(f"hf:{world.target}"))
    assert precision_of(half) == "bf16" and precision_of(fp32) == "fp32"
    assert (
        model_key(half) == f"{model_info(fp32).weights_key}-bf16"
        and model_key(fp32) == model_info(fp32).weights_key
    )
    full = embed_grid(fp32, task, bank, progress=False)
    reduced = embed_grid(half, task, bank, progress=False)
    assert reduced.computed  # never read from the fp32 entry
    assert (
        reduced.made_by == {"device": "cpu", "precision": "bf16", "runtime": "torch"}
        and full.made_by["precision"] == "fp32"
    )
    assert not torch.equal(reduced.inputs, full.inputs)
    relative = (reduced.inputs - full.inputs).norm() / full.inputs.norm()
    assert 0 < relative < 0.05  # bf16 keeps about 3 significant digits
    assert not embed_grid(half, task, bank, progress=False).computed  # and is itself cached
    entry = bank.read_entry(bank.embeddings_rel(model_key(half), task.grid_hash))
    assert entry.meta["precision"] == "bf16" and entry.meta["device"] == "cpu"


def test_the_report_and_lock_say_which_device_and_precision_made_each_embedding(
    world, bank_copy, tmp_path
):
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    result = run_ptc("build", recipe, "--precision", "bf16", "--device", "cpu")
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["embeddings"] == {  # bf16: torch's autocast, never onnxruntime
        "colour": {"device": "cpu", "precision": "bf16", "runtime": "torch"},
        "shape": {"device": "cpu", "precision": "bf16", "runtime": "torch"},
    }
    lock = json.loads((tmp_path / "out" / "ptc.lock").read_text())
    assert lock["edit"]["embeddings"] == report["embeddings"]
    # Verification still compares fp32 passes on the CPU against fp32 references.
    assert report["verify"]["equivalence"]["torch_max_abs_diff"] < 1e-5
    # fp32 again: other entries, other figures
    assert run_ptc("build", recipe, "--force").returncode == 0
    again = json.loads((tmp_path / "out" / "report.json").read_text())
    assert again["embeddings"]["colour"]["precision"] == "fp32"
    assert again["terms"][0]["operator_sha256"] != report["terms"][0]["operator_sha256"]


def test_the_cpu_a_figure_was_measured_on_is_named_by_what_decides_its_speed(tmp_path):
    """Two machines Linux calls "AMD EPYC", one with AVX-512 bf16: told apart (the runtime
    `auto` chose on one is not the other's, and a committed figure names its machine)."""
    names = []
    for family, flags in (("23", "fpu sse2 fma avx2"), ("26", "fma avx2 avx512f avx512_bf16")):
        info = tmp_path / f"cpuinfo-{family}"
        cpu = f"processor\t: {{}}\ncpu family\t: {family}\nmodel\t\t: 2\nmodel name\t: AMD EPYC\n"
        info.write_text("\n".join(cpu.format(i) + f"flags\t\t: {flags}\n" for i in range(2)))
        names.append(cpu_name(info))
    assert names == [
        "AMD EPYC (family 23, model 2; avx2)",
        "AMD EPYC (family 26, model 2; avx2, avx512f, avx512_bf16)",
    ]
    assert cpu_name(tmp_path / "missing")  # elsewhere: what the platform module knows
