"""Embedding passes on onnxruntime (compiler/export/onnx_embed.py): a build's target grids
embedded through the cached base export agree with the model's own torch passes to float
rounding, are cached apart from them, named in the lock, and chosen only where they apply."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from conftest import FAMILIES, run_ptc, write_recipe
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.embed import model_info, model_key
from ptc.compiler.export.onnx_embed import choose_runtime
from ptc.compiler.export.tower_cache import cached_base, export_key
from ptc.devices import CPU, place
from ptc.errors import InputError


def test_a_build_embeds_its_target_on_onnxruntime_apart_from_torch(world, bank_copy, tmp_path):
    target = targets.load(f"hf:{world.target}")
    key = model_key(target)
    for folder in (bank_copy / "embeddings").glob(f"{key}*"):
        shutil.rmtree(folder)  # whatever other tests cached: this build embeds afresh
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    built = run_ptc("build", recipe, "--json")  # auto, and the build writes ONNX: onnxruntime
    assert built.returncode == 0, built.stderr
    result = json.loads(built.stdout)
    assert result["run"]["cache"]["embeddings_computed"] == 2
    assert "export_base" in result["run"]["timings"]
    lock = json.loads((tmp_path / "recipe.lock").read_text())
    assert {made["runtime"] for made in lock["edit"]["embeddings"].values()} == {"onnxruntime"}

    # The same grids through torch: cached under another key, the same numbers to rounding.
    again = run_ptc("build", recipe, "--embed-runtime", "torch", "--no-export")
    assert again.returncode == 0, again.stderr
    bank = Bank(bank_copy)
    for name in ("colour", "shape"):
        task = bank.task(name)
        ort = bank.read_entry(bank.embeddings_rel(f"{key}-onnxruntime", task.grid_hash))
        eager = bank.read_entry(bank.embeddings_rel(key, task.grid_hash))
        assert ort is not None and eager is not None
        assert (ort.meta["runtime"], eager.meta["runtime"]) == ("onnxruntime", "torch")
        with torch.inference_mode():  # an independent pass over the probe files
            expected = target.embed_inputs(target.load_inputs(list(task.probes)))
        assert (ort.tensors["inputs"] - expected).abs().max() < 1e-5
        assert torch.equal(eager.tensors["inputs"], expected)
        assert torch.equal(ort.tensors["prompts"], eager.tensors["prompts"])  # torch's, both


def test_onnxruntime_is_chosen_only_where_it_applies(world, tmp_path):
    bank = Bank(tmp_path / "bank")
    clip = targets.load(f"hf:{world.target}")
    assert choose_runtime(clip, bank, "auto", export_due=False) == "torch"  # nothing to reuse
    assert choose_runtime(clip, bank, "auto", export_due=True) == "onnxruntime"
    assert choose_runtime(clip, bank, "torch", export_due=True) == "torch"
    tower = clip.onnx_towers()[0]  # once its base export is cached, a pass reuses it
    cached_base(bank, export_key(model_info(clip).weights_key, tower), tower)
    assert choose_runtime(clip, bank, "auto", export_due=False) == "onnxruntime"
    place(clip, CPU, "bf16")
    assert choose_runtime(clip, bank, "auto", export_due=True) == "torch"
    with pytest.raises(InputError, match=r"passes run in bf16 \(onnxruntime runs the fp32 graph\)"):
        choose_runtime(clip, bank, "onnxruntime", export_due=True)
    build, scheme = FAMILIES["hf-siglip"]
    siglip = targets.load(scheme.format(build(tmp_path / "siglip", seed=0)))
    assert choose_runtime(siglip, bank, "auto", export_due=True) == "torch"
    with pytest.raises(InputError, match="its edit acts through rows inside the input tower"):
        choose_runtime(siglip, bank, "onnxruntime", export_due=True)


def test_a_runtime_that_cannot_run_is_refused_in_one_line_before_any_pass(world, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    result = run_ptc(
        "build", recipe, "--embed-runtime", "onnxruntime", "--precision", "bf16", "--no-export"
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ptc: error: --embed-runtime onnxruntime: not for hf:{world.target}: its passes run "
        "in bf16 (onnxruntime runs the fp32 graph) (hint: use --embed-runtime auto (it picks "
        "torch there) or torch)"
    ]
