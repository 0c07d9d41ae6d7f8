"""Every registered family meets one contract, and descriptors cross families and widths."""

from __future__ import annotations

import json
import shutil

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file, save_file

import targets
from compiler.bank import Bank
from compiler.embed import model_key
from conftest import run_ptc, write_recipe
from targets import hf_clip, openclip

# family -> (tiny builder, reference scheme for a saved folder); a new family adds one row.
FAMILIES = {
    "hf-clip": (lambda folder, seed: hf_clip.build_tiny(folder, width=32, embed_dim=12, seed=seed), "hf:{}"),
    "open_clip-vit": (lambda folder, seed: openclip.build_tiny(folder, width=32, embed_dim=20, seed=seed),
                      "open_clip:local-dir:{}"),
    "open_clip-eva02": (lambda folder, seed: openclip.build_tiny_timm(folder, embed_dim=24, seed=seed),
                        "open_clip:local-dir:{}"),
    "open_clip-resnet": (lambda folder, seed: openclip.build_tiny_resnet(folder, embed_dim=16, seed=seed),
                         "open_clip:local-dir:{}"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_contract(family, tmp_path, world):
    build, scheme = FAMILIES[family]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=4)))
    assert isinstance(encoder, targets.DualEncoder)
    probes = list(Bank(world.bank).task("colour").probes)[:5]
    batch = encoder.load_inputs(probes)
    z, regressors = encoder.embed_for_edit(batch)
    assert z.shape == (5, encoder.embed_dim) and torch.equal(z, encoder.embed_inputs(batch))
    rows = z if regressors is None else regressors
    assert rows.shape == (5, encoder.edit_width)
    assert encoder.embed_prompts(["a red thing.", "a photo of a blue circle shape."]).shape == (2, encoder.embed_dim)
    edit = torch.randn(encoder.embed_dim, encoder.edit_width, generator=torch.Generator().manual_seed(0),
                       dtype=torch.float64) * 0.05
    edited = encoder.with_edit(edit)
    expected = z.double() + rows.double() @ edit.T  # the protocol's promise, computed here by hand
    assert (edited.embed_inputs(batch).double() - expected).abs().max() < 1e-5
    assert edited.text_fingerprint() == encoder.text_fingerprint()       # the edit leaves text alone
    assert edited.input_fingerprint() != encoder.input_fingerprint()
    saved = edited.save_native(tmp_path / "saved")
    reloaded = targets.load(f"{saved}:{tmp_path / 'saved'}")
    assert torch.equal(reloaded.embed_inputs(reloaded.load_inputs(probes)), edited.embed_inputs(batch))
    towers = edited.onnx_towers()
    assert towers[0].output_name.endswith("_embeds") and len(next(iter(towers[0].example_inputs.values()))) >= 2
    assert set(towers[0].example_inputs) == set(batch)  # a batch feeds the input tower's graph as it is
    assert encoder.library and encoder.pipeline_tag and "\n" in encoder.load_snippet("model")


@pytest.fixture(scope="module")
def open_clip_models(tmp_path_factory):
    """An open_clip ViT target (d = 20) and an open_clip source with a full fine-tune (d = 28)."""
    root = tmp_path_factory.mktemp("open_clip")
    target = openclip.build_tiny(root / "target", width=32, embed_dim=20, seed=3)
    source = openclip.build_tiny(root / "source", width=48, embed_dim=28, seed=6)
    tuned = root / "source-ft"
    shutil.copytree(source, tuned)
    state = load_file(tuned / "open_clip_model.safetensors")
    generator = torch.Generator().manual_seed(9)
    for name in state:  # a stand-in fine-tune of the image tower only
        if name.startswith("visual.transformer") and state[name].is_floating_point():
            state[name] = state[name] + 0.02 * torch.randn(state[name].shape, generator=generator)
    save_file(state, str(tuned / "open_clip_model.safetensors"), metadata={"format": "pt"})
    return {"target": target, "source": source, "tuned": tuned}


@pytest.mark.parametrize("tower", ["vit", "eva02", "resnet"])
def test_hf_clip_descriptors_build_into_an_open_clip_target(world, open_clip_models, bank_copy, tmp_path, tower):
    import open_clip

    folder = {"vit": lambda: open_clip_models["target"],
              "eva02": lambda: openclip.build_tiny_timm(tmp_path / "eva", embed_dim=20),
              "resnet": lambda: openclip.build_tiny_resnet(tmp_path / "resnet", embed_dim=20)}[tower]()
    ref = f"open_clip:local-dir:{folder}"
    recipe = write_recipe(tmp_path / "recipe.yaml", world, target=ref, bank=str(bank_copy))
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    report = json.loads((out / "report.json").read_text())
    verify = report["verify"]
    assert verify["linearity"]["max_rel_diff_fp64"] <= 1e-12 and verify["linearity"]["max_rel_diff_fp32"] <= 1e-6
    assert max(verify["equivalence"][k] for k in ("torch_max_abs_diff", "onnx_max_abs_diff",
                                                  "reload_max_abs_diff")) <= 1e-5
    assert report["native_ref"] == "open_clip:local-dir:model" and report["embed_dim"] == 20
    # open_clip itself loads the output, and it is the base with (I + A) folded in.
    bank, base = Bank(bank_copy), targets.load(ref)
    key = model_key(base)
    operator = sum(t["weight"] * bank.read_entry(bank.operator_rel(key, t["grid_hash"], t["descriptor_sha256"], 1.0))
                   .tensors["operator"].double() for t in report["terms"])
    edited = open_clip.create_model(f"local-dir:{out / 'model'}").eval()
    pixels = base.load_inputs(list(bank.task("shape").probes)[:6])
    with torch.no_grad():
        got = edited.encode_image(pixels["pixel_values"]).double()
    expected = base.embed_inputs(pixels).double() @ (torch.eye(20, dtype=torch.float64) + operator).T
    assert (got - expected).abs().max() < 1e-5
    session = ort.InferenceSession(str(out / "onnx" / "vision_model.onnx"), providers=["CPUExecutionProvider"])
    assert np.abs(session.run(None, {"pixel_values": pixels["pixel_values"].numpy()})[0] - got.numpy()).max() < 1e-5


def test_open_clip_source_into_an_hf_clip_target(world, open_clip_models, bank_copy, tmp_path):
    source = f"open_clip:local-dir:{open_clip_models['source']}"
    result = run_ptc("descriptor", "add", "--task", "colour", "--source", source, "--finetuned",
                     f"open_clip:local-dir:{open_clip_models['tuned']}", "--id", "oc", "--bank", bank_copy)
    assert result.returncode == 0, result.stderr
    assert Bank(bank_copy).descriptor("colour", "oc").tensors["utd"].abs().max() > 1e-4
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy),
                          terms=[{"task": "colour", "source": "oc", "weight": 0.5},
                                 {"task": "colour", "source": "src", "weight": 0.5}])
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "out" / "report.json").read_text())["verify"]["linearity"]["max_rel_diff_fp64"] <= 1e-12


def test_open_clip_refuses_peft_adapters_with_a_clear_line(world, open_clip_models, bank_copy):
    result = run_ptc("descriptor", "add", "--task", "colour", "--source",
                     f"open_clip:local-dir:{open_clip_models['source']}", "--finetuned", world.adapters["colour"],
                     "--bank", bank_copy)
    assert result.returncode == 2 and "packs q, k and v into one in_proj matrix" in result.stderr
    result = run_ptc("check", write_recipe(bank_copy.parent / "r.yaml", world,
                                           target=f"open_clip:ViT-B-32@{bank_copy.parent / 'none.bin'}"))
    assert result.returncode == 2 and "never unpickles" in result.stderr
