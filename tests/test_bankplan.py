"""`ptc bank build PLAN.yaml`: in-process and on a local Ray instance, byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from conftest import run_ptc
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.sources.bank_plan import load_plan, run_plan
from ptc.errors import PlanError


def _random_adapter(model_ref: str, folder: Path, seed: int) -> str:
    from ptc.compiler.edit.lora import attach_lora

    module = attach_lora(
        targets.load(model_ref), rank=2, alpha=4, seed=seed, device=torch.device("cpu")
    )
    generator = torch.Generator().manual_seed(seed)
    for parameter in module.parameters():
        if parameter.requires_grad:
            parameter.data.normal_(0.0, 0.05, generator=generator)
    module.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def plan_file(world, tmp_path_factory) -> Path:
    """2 targets x 2 sources x 2 tasks, of three different widths."""
    from ptc.lab.tiny.hf_clip import build_tiny

    root = tmp_path_factory.mktemp("plan")
    other = build_tiny(root / "other", width=40, embed_dim=20, seed=5)
    plan = {
        "tasks": [str(world.tasks["colour"]), str(world.tasks["shape"])],
        "sources": [
            {
                "id": "a",
                "pre": f"hf:{world.source}",
                "finetuned": {
                    "colour": str(world.adapters["colour"]),
                    "shape": str(world.adapters["shape"]),
                },
            },
            {
                "id": "b",
                "pre": f"hf:{other}",
                "finetuned": {
                    name: _random_adapter(f"hf:{other}", root / f"b-{name}", seed)
                    for seed, name in enumerate(("colour", "shape"))
                },
            },
        ],
        "targets": [f"hf:{world.target}", f"hf:{other}"],
    }
    path = root / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def _files(bank: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(bank)): p.read_bytes()
        for p in sorted(bank.rglob("*"))
        if p.is_file() and ".locks" not in p.parts
    }


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def test_in_process_and_ray_give_identical_bank_bytes(plan_file, tmp_path, ray_local, monkeypatch):
    plan = load_plan(plan_file)
    local = run_plan(plan, Bank(tmp_path / "local"), progress=False)
    assert (
        local["descriptors_computed"] == 4
        and local["operators_solved"] == 8
        and local["factors_computed"] == 4
    )
    on_ray = run_plan(plan, Bank(tmp_path / "ray"), ray_address="local", progress=False)
    assert on_ray == local
    local_files, ray_files = _files(tmp_path / "local"), _files(tmp_path / "ray")
    assert sorted(local_files) == sorted(ray_files) and len(local_files) > 20
    assert [name for name in local_files if local_files[name] != ray_files[name]] == []
    # A second run finds everything: nothing is recomputed.
    again = run_plan(plan, Bank(tmp_path / "ray"), ray_address="local", progress=False)
    assert sum(again.values()) == 0


def test_worker_killed_mid_job_is_retried_without_corrupting_the_bank(
    plan_file, tmp_path, ray_local, monkeypatch
):
    marker = tmp_path / "crashed-once"
    monkeypatch.setenv("PTC_RAY_CRASH_ONCE", str(marker))
    plan = load_plan(plan_file)
    counts = run_plan(plan, Bank(tmp_path / "ray"), ray_address="local", progress=False)
    assert marker.exists()  # a worker really died mid-job
    assert counts["operators_solved"] == 8
    assert Bank(tmp_path / "ray").verify_all()[1] == []
    monkeypatch.delenv("PTC_RAY_CRASH_ONCE")
    reference = run_plan(plan, Bank(tmp_path / "local"), progress=False)
    assert reference == counts and _files(tmp_path / "local") == _files(tmp_path / "ray")


def test_bank_build_cli_and_plan_errors(plan_file, tmp_path):
    result = run_ptc("bank", "build", plan_file, "--bank", tmp_path / "bank")
    assert result.returncode == 0, result.stderr
    assert "descriptors computed 4" in result.stdout and "operators solved 8" in result.stdout
    bad = tmp_path / "bad.yaml"
    plan = yaml.safe_load(plan_file.read_text())
    plan["sources"][0]["finetuned"]["texture"] = "x"
    bad.write_text(yaml.safe_dump(plan))
    with pytest.raises(
        PlanError, match=r"sources\[0\]\.finetuned: task 'texture' is not one of the plan's tasks"
    ):
        load_plan(bad)
    plan["sources"][0]["finetuned"].pop("texture")
    plan["sourcse"] = plan.pop("sources")
    bad.write_text(yaml.safe_dump(plan))
    result = run_ptc("bank", "build", bad, "--bank", tmp_path / "bank2")
    assert (
        result.returncode == 2
        and "unknown key 'sourcse' (did you mean 'sources'?)" in result.stderr
    )
