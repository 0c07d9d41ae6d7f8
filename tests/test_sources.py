"""Descriptors from peft adapters and from full checkpoints, against transformers + peft
used directly; `ptc finetune`; the demo; the family protocol."""

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoTokenizer, CLIPModel

from conftest import REPO, clip_pixels, run_ptc
from ptc.compiler.bank.store import Bank
from ptc.compiler.verify.evaluate import resolve_model


def _independent_descriptor(world, task_name):
    task = Bank(world.bank).task(task_name)
    base = CLIPModel.from_pretrained(world.source).eval()
    tuned = PeftModel.from_pretrained(
        CLIPModel.from_pretrained(world.source), world.adapters[task_name]
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(world.source)
    pixels = clip_pixels(list(task.probes), world.source)
    with torch.no_grad():
        text = base.get_text_features(
            **tokenizer(task.prompts, padding=True, return_tensors="pt")
        ).pooler_output
        text = torch.nn.functional.normalize(text.double(), dim=-1).reshape(
            len(task.classes), -1, text.shape[-1]
        )
        rows = torch.nn.functional.normalize(text.mean(1), dim=-1)
        f_pre = torch.nn.functional.normalize(
            base.get_image_features(pixel_values=pixels).pooler_output.double(), dim=-1
        )
        f_ft = torch.nn.functional.normalize(
            tuned.get_image_features(pixel_values=pixels).pooler_output.double(), dim=-1
        )
    return f_ft @ rows.T - f_pre @ rows.T


@pytest.mark.parametrize("task_name", ["colour", "shape"])
def test_adapter_descriptor_matches_transformers_and_peft(world, task_name):
    stored = Bank(world.bank).descriptor(task_name, "src")
    expected = _independent_descriptor(world, task_name)
    assert (
        stored.tensors["utd"].shape
        == expected.shape
        == (16, len(Bank(world.bank).task(task_name).classes))
    )
    assert float(expected.abs().max()) > 1e-4  # the fine-tune moved the affinities
    assert (stored.tensors["utd"].double() - expected).abs().max() < 1e-5
    assert stored.meta["grid_hash"] == Bank(world.bank).task(task_name).grid_hash


def test_full_checkpoint_and_adapter_give_the_same_descriptor(world):
    bank = Bank(world.bank)
    adapter, full = bank.descriptor("colour", "src"), bank.descriptor("colour", "full")
    assert (adapter.tensors["utd"] - full.tensors["utd"]).abs().max() < 1e-5
    assert adapter.meta["text_fingerprint"] == full.meta["text_fingerprint"]


def test_descriptor_add_and_finetune_through_the_cli(world, bank_copy, tmp_path):
    data = world.tasks["shape"].parent / "train"
    result = run_ptc(
        "finetune",
        "--task",
        "shape",
        "--source",
        f"hf:{world.source}",
        "--data",
        data,
        "--out",
        tmp_path / "lora",
        "--steps",
        "3",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "lora" / "adapter_config.json").read_text())
    assert config["r"] == 4 and "vision_model" in config["target_modules"]
    # the reference it was trained from
    assert config["base_model_name_or_path"] == f"hf:{world.source}"
    assert f"base_model: hf:{world.source}\n" in (tmp_path / "lora" / "README.md").read_text()
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "shape",
        "--source",
        f"hf:{world.source}",
        "--finetuned",
        tmp_path / "lora",
        "--id",
        "cli",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 0, result.stderr
    assert "descriptor shape/cli: 16x3" in result.stdout
    assert "cli" in Bank(bank_copy).descriptor_ids("shape")
    # The refusal to overwrite a non-empty adapter folder.
    again = run_ptc(
        "finetune",
        "--task",
        "shape",
        "--source",
        f"hf:{world.source}",
        "--data",
        data,
        "--out",
        tmp_path / "lora",
        "--steps",
        "1",
        "--bank",
        bank_copy,
    )
    assert again.returncode == 2 and "--force" in again.stderr


def test_lora_dropout_reaches_training_and_the_adapter_records_it(world, bank_copy, tmp_path):
    """`--lora-dropout` is peft's lora_dropout: recorded in the adapter's config and its card,
    it changes what training learns (same seed, other factors), and `ptc descriptor add` reads
    the adapter (which it merges, so no dropout module is left to act)."""
    from safetensors.torch import load_file

    data = world.tasks["shape"].parent / "train"
    common = (
        "finetune",
        "--task",
        "shape",
        "--source",
        f"hf:{world.source}",
        "--data",
        data,
        "--steps",
        "3",
        "--bank",
        bank_copy,
    )
    for name, rate in (("plain", "0"), ("dropped", "0.5")):
        result = run_ptc(*common, "--out", tmp_path / name, "--lora-dropout", rate)
        assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "dropped" / "adapter_config.json").read_text())
    assert config["lora_dropout"] == 0.5
    assert "LoRA dropout 0.5" in (tmp_path / "dropped" / "README.md").read_text()
    assert "dropout" not in (tmp_path / "plain" / "README.md").read_text()
    plain, dropped = (
        load_file(tmp_path / name / "adapter_model.safetensors") for name in ("plain", "dropped")
    )
    assert plain.keys() == dropped.keys()
    assert max(float((plain[k] - dropped[k]).abs().max()) for k in plain) > 1e-6
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "shape",
        "--source",
        f"hf:{world.source}",
        "--finetuned",
        tmp_path / "dropped",
        "--id",
        "dropped",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 0, result.stderr
    assert float(Bank(bank_copy).descriptor("shape", "dropped").tensors["utd"].abs().max()) > 1e-4


def test_lora_dropout_outside_its_range_is_refused_before_anything_is_written(
    world, bank_copy, tmp_path
):
    result = run_ptc(
        "finetune",
        "--task",
        "shape",
        "--source",
        f"hf:{world.source}",
        "--data",
        world.tasks["shape"].parent / "train",
        "--out",
        tmp_path / "lora",
        "--lora-dropout",
        "1",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 2
    assert "Invalid value for '--lora-dropout': 1.0 is not in the range 0.0<=x<1.0" in result.stderr
    assert not (tmp_path / "lora").exists()


def test_resolve_model_of_a_build_output(built):
    out, _ = built
    assert resolve_model(str(out)) == ("hf:model", out.resolve())


def test_demo_runs_end_to_end_and_the_example_recipe_builds_on_it(tmp_path):
    result = run_ptc("demo", "--workdir", tmp_path / "ptc-demo", "--steps", "3")
    assert result.returncode == 0, result.stderr
    assert "target zero-shot on colour" in result.stdout and "verified: linearity" in result.stdout
    assert (tmp_path / "ptc-demo" / "dist" / "target-edit" / "onnx" / "vision_model.onnx").is_file()
    # recipes/ptc-demo.yaml names its paths relative to itself, as laid out in a checkout.
    (tmp_path / "recipes").mkdir()
    recipe = tmp_path / "recipes" / "ptc-demo.yaml"
    recipe.write_bytes((REPO / "recipes" / "ptc-demo.yaml").read_bytes())
    assert run_ptc("check", recipe).returncode == 0
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "recipes" / "dist" / "demo-edit" / "report.json").is_file()
