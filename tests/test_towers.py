"""ONNX towers written from the per-model export cache: an edit's graph patched from the cached
base graph is the graph a fresh export of the edited model gives; what cannot be patched is
exported afresh; a damaged cache is refused; tensors go to external data, so towers over the
protobuf limit export too."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from test_families import FAMILIES

from conftest import run_ptc, write_recipe
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.export import tower_cache as towers
from ptc.compiler.export.onnx_graph import copy_onnx, export_onnx, onnx_files

# One family per way the exported graph holds the edit site: a Linear's weight by name (CLIP),
# transposed under a generated name (SigLIP's and SigLIP2's head MLP), a bare projection
# parameter (open_clip). The other open_clip towers fold the same parameter as open_clip-vit.
IMAGE_FAMILIES = ["hf-clip", "hf-siglip", "hf-siglip2", "open_clip-vit"]


def _run(path, inputs: dict) -> np.ndarray:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {k: v.numpy() for k, v in inputs.items()})[0]


def _edited(encoder, seed: int = 0, scale: float = 0.05):
    edit = (
        torch.randn(
            encoder.embed_dim,
            encoder.edit_width,
            generator=torch.Generator().manual_seed(seed),
            dtype=torch.float64,
        )
        * scale
    )
    return encoder.with_edit(edit)


@pytest.mark.parametrize("family", IMAGE_FAMILIES)
def test_a_patched_tower_is_a_fresh_export_of_the_edited_model(family, tmp_path):
    build, scheme = FAMILIES[family]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=3)))
    edited = _edited(encoder)
    hows = []
    for base, tower in zip(encoder.onnx_towers(), edited.onnx_towers()):
        path = tmp_path / "out" / f"{tower.name}.onnx"
        hows.append(
            towers.write_tower(
                Bank(tmp_path / "cache"), "model", base, tower, path, {"ptc_test": "1"}
            )
        )
        export_onnx(tower, tmp_path / "fresh" / path.name)
        fresh = onnx.load(str(tmp_path / "fresh" / path.name))
        patched = onnx.load(str(path))
        # The same graph: same initializers, byte for byte, and the same outputs.
        held = {init.name: onnx.numpy_helper.to_array(init) for init in patched.graph.initializer}
        assert sorted(held) == sorted(init.name for init in fresh.graph.initializer)
        assert all(
            np.array_equal(held[i.name], onnx.numpy_helper.to_array(i))
            for i in fresh.graph.initializer
        )
        got, want = (
            _run(path, tower.example_inputs),
            _run(tmp_path / "fresh" / path.name, tower.example_inputs),
        )
        assert np.abs(got - want).max() <= 1e-6
        with torch.inference_mode():
            assert np.abs(got - tower.module(**tower.example_inputs).numpy()).max() < 1e-5
        assert {p.key: p.value for p in patched.metadata_props}["ptc_test"] == "1"
    assert hows == ["patched", "reused"]  # the image edit leaves the text tower's graph as cached
    # A second edit of the same model exports nothing: both graphs come from the cache, untouched.
    cached = sorted((tmp_path / "cache" / "exports").rglob("*.onnx*"))
    assert sorted(p.name for p in cached if p.suffix == ".onnx") == sorted(
        f"{t.name}.onnx" for t in encoder.onnx_towers()
    )
    stamps = {p: p.stat().st_mtime_ns for p in cached}
    second = _edited(encoder, seed=1).onnx_towers()[0]
    base = encoder.onnx_towers()[0]
    assert (
        towers.write_tower(
            Bank(tmp_path / "cache"), "model", base, second, tmp_path / "again.onnx", {}
        )
        == "patched"
    )
    assert {
        p: p.stat().st_mtime_ns for p in sorted((tmp_path / "cache" / "exports").rglob("*.onnx*"))
    } == stamps
    with torch.inference_mode():
        expected = second.module(**second.example_inputs).numpy()
    assert np.abs(_run(tmp_path / "again.onnx", second.example_inputs) - expected).max() < 1e-5


def test_the_other_towers_are_paged_out_only_while_a_base_export_runs(tmp_path, monkeypatch):
    """A base export holds the traced graph beside the whole model: the towers it does not trace
    are paged out for it (ptc/devices.py), and left alone where the export is cached."""
    build, scheme = FAMILIES["hf-clip"]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=3)))
    vision, text = encoder.onnx_towers()
    paged: list[torch.nn.Module] = []
    monkeypatch.setattr(towers, "page_out_weights", paged.append)
    bank, key = Bank(tmp_path / "cache"), towers.export_key("k", vision)
    path = towers.cached_base(bank, key, vision, idle=[text.module])
    assert paged == [text.module]
    assert towers.cached_base(bank, key, vision, idle=[text.module]) == path
    assert paged == [text.module]  # cached: nothing exported, nothing paged out


def test_what_cannot_be_matched_is_exported_afresh(tmp_path):
    build, scheme = FAMILIES["hf-clip"]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=3)))
    base = encoder.onnx_towers()[0]
    cached = onnx_files(
        towers.cached_base(Bank(tmp_path / "cache"), towers.export_key("k", base), base)
    )
    # uniform: a match by value would be a guess
    encoder.model.visual_projection.weight.data.fill_(0.01)
    base, tower = encoder.onnx_towers()[0], _edited(encoder).onnx_towers()[0]
    assert towers.find_patches(cached, towers.changed_tensors(base.module, tower.module)) is None
    assert (
        towers.write_tower(Bank(tmp_path / "cache2"), "k", base, tower, tmp_path / "v.onnx", {})
        == "exported"
    )
    with torch.inference_mode():
        expected = tower.module(**tower.example_inputs).numpy()
    assert np.abs(_run(tmp_path / "v.onnx", tower.example_inputs) - expected).max() < 1e-5
    # A tensor held twice cannot be patched in one place either.
    weight = torch.randn(4, 5)
    twice = tmp_path / "twice.bin"
    twice.write_bytes(b"x" * 3 + towers._raw(weight) + b"y" + towers._raw(weight.T) + b"z")
    assert towers.find_patches([twice], {"w": (weight, weight + 1)}) is None
    once = tmp_path / "once.bin"
    once.write_bytes(b"x" * 3 + towers._raw(weight.T) + b"y")
    assert towers.find_patches([once], {"w": (weight, weight + 1)}) == [
        (once, 3, towers._raw((weight + 1).T))
    ]
    assert towers._offsets(once, [towers._raw(weight.T)], chunk=7) == {
        towers._raw(weight.T): [3]
    }  # across chunks


def test_a_damaged_export_cache_is_refused_and_ships_nothing(world, bank_copy, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    assert run_ptc("build", recipe).returncode == 0
    cached = next((bank_copy / "exports").glob("*/vision_model.onnx"))
    model = onnx.load(str(cached))
    # some other weight than the edit's
    victim = max(model.graph.initializer, key=lambda i: len(i.raw_data))
    values = onnx.numpy_helper.to_array(victim).copy()
    values.flat[0] += 1.0
    victim.CopyFrom(onnx.numpy_helper.from_array(values, victim.name))
    onnx.save(model, str(cached))
    recipe = write_recipe(
        tmp_path / "recipe.yaml", world, bank=str(bank_copy), export={"out": str(tmp_path / "out2")}
    )
    result = run_ptc("build", recipe)
    assert (
        result.returncode == 2
        and "does not match its record (modified or damaged)" in result.stderr
    ), result.stderr
    assert "the next build exports it again" in result.stderr and not (tmp_path / "out2").exists()
    assert any(
        "vision_model.onnx does not match its record" in p for p in Bank(bank_copy).verify_all()[1]
    )


def test_towers_are_written_with_their_tensors_as_external_data(tmp_path):
    build, scheme = FAMILIES["hf-clip"]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=3)))
    edited = _edited(encoder)
    base, tower = encoder.onnx_towers()[0], edited.onnx_towers()[0]
    path = tmp_path / "out" / "vision_model.onnx"
    assert towers.write_tower(Bank(tmp_path / "cache"), "k", base, tower, path, {}) == "patched"
    assert [p.name for p in onnx_files(path)] == ["vision_model.onnx", "vision_model.onnx.data"]
    graph = onnx.load(str(path), load_external_data=False)
    external = [i for i in graph.graph.initializer if i.data_location == onnx.TensorProto.EXTERNAL]
    assert external and all(
        len(i.raw_data) <= 1024 for i in graph.graph.initializer if i not in external
    )
    with torch.inference_mode():
        expected = tower.module(**tower.example_inputs).numpy()
    assert np.abs(_run(path, tower.example_inputs) - expected).max() < 1e-5
    # Triton's layout keeps the data
    copied = copy_onnx(path, tmp_path / "triton" / "1", "model.onnx")
    assert np.abs(_run(copied, tower.example_inputs) - expected).max() < 1e-5


def test_a_tower_over_2gb_exports_and_runs(tmp_path):
    """A real > 2 GiB tower: a text tower whose token table alone is 2.3 GB (the protobuf
    message limit is 2 GiB; without external data this export fails)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from ptc.lab.tiny_vocab import clip_tokenizer
    from ptc.targets.hf_clip import HFClip

    tokenizer = clip_tokenizer()
    vocab = tokenizer.get_vocab()
    text = dict(
        vocab_size=1_150_000,
        hidden_size=512,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=16,
        eos_token_id=vocab["<|endoftext|>"],
        bos_token_id=vocab["<|startoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )
    vision = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=32,
        patch_size=16,
    )
    with torch.device("meta"):
        model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=16))
    model = model.to_empty(device="cpu").eval()
    generator = torch.Generator().manual_seed(0)
    for parameter in model.parameters():
        parameter.data.normal_(0, 0.02, generator=generator)
    for name, buffer in model.named_buffers():
        if name.endswith("position_ids"):
            buffer.copy_(torch.arange(buffer.shape[-1]).expand_as(buffer))
    processor = CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}
    )
    encoder = HFClip(model, tokenizer, processor, ref="big")
    tower = encoder.onnx_towers()[1]
    assert sum(p.numel() * p.element_size() for p in tower.module.parameters()) > 2**31
    path = tmp_path / "text_model.onnx"
    assert (
        towers.write_tower(Bank(tmp_path / "cache"), "big", tower, tower, path, {"ptc_test": "1"})
        == "reused"
    )
    assert path.with_name("text_model.onnx.data").stat().st_size > 2**31
    with torch.inference_mode():
        expected = tower.module(**tower.example_inputs).numpy()
    assert np.abs(_run(path, tower.example_inputs) - expected).max() < 1e-5
    assert {p.key: p.value for p in onnx.load(str(path), load_external_data=False).metadata_props}[
        "ptc_test"
    ] == "1"


def test_an_exported_model_is_held_by_nothing_the_export_left_behind(tmp_path):
    """The exporter's rewrite rules keep the last graph they matched; a build lets its models go
    before its reload check, so nothing of that graph may still reach their parameters."""
    import gc
    import sys

    from ptc.lab.tiny import hf_clip

    model = targets.load(f"hf:{hf_clip.build_tiny(tmp_path / 'm')}")
    params = dict(model.model.named_parameters())
    before = {name: sys.getrefcount(p) for name, p in params.items()}
    export_onnx(model.onnx_towers()[0], tmp_path / "v.onnx")
    gc.collect()
    held = [name for name, p in params.items() if sys.getrefcount(p) > before[name]]
    assert held == [], f"{len(held)} parameters still referenced, first {held[0]!r}"
    assert ort.InferenceSession(str(tmp_path / "v.onnx")).get_inputs()  # written whole
