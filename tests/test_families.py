"""Every registered family meets one contract, and descriptors cross families and widths."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import FAMILIES, built_key, run_card_snippets, run_ptc, write_recipe
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.errors import ModelError
from ptc.lab import tiny_vocab
from ptc.lab.tiny import hf_clap, hf_siglip, openclip  # the tiny builders
from ptc.targets.openclip import WEIGHTS


def test_the_contract_table_covers_every_registered_family():
    # A family registered without a row here would escape the contract below.
    hf_rows = {"hf-clip": "clip", "hf-siglip": "siglip", "hf-siglip2": "siglip2", "hf-clap": "clap"}
    assert sorted(targets.HF_MODEL_TYPES) == sorted(hf_rows.values()) and set(hf_rows) <= set(
        FAMILIES
    )
    # zoo: is no family: it resolves to a member's hf: or open_clip: checkpoint (tests/test_zoo.py).
    assert targets.schemes() == ["hf", "open_clip", "zoo"]  # plugins loaded, whatever ran first


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_contract(family, tmp_path, request):
    build, scheme, modality = (*FAMILIES[family], "image")[:3]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=4)))
    assert all(
        isinstance(encoder, protocol)
        for protocol in (targets.DualEncoder, targets.Exportable, targets.Trainable)
    )
    world = request.getfixturevalue("audio_world" if modality == "audio" else "world")
    probes = list(Bank(world.bank).task("pitch" if modality == "audio" else "colour").probes)[:5]
    batch = encoder.load_inputs(probes)
    z, regressors = encoder.embed_for_edit(batch)
    assert z.shape == (5, encoder.embed_dim) and torch.equal(z, encoder.embed_inputs(batch))
    rows = z if regressors is None else regressors
    assert rows.shape == (5, encoder.edit_width)
    # what decides whether its graph alone can embed for an edit (compiler/export/onnx_embed.py)
    assert encoder.edit_acts_on_embeddings == (regressors is None)
    assert encoder.embed_prompts(["a red thing.", "a photo of a blue circle shape."]).shape == (
        2,
        encoder.embed_dim,
    )
    edit = (
        torch.randn(
            encoder.embed_dim,
            encoder.edit_width,
            generator=torch.Generator().manual_seed(0),
            dtype=torch.float64,
        )
        * 0.05
    )
    before = {name: t.clone() for name, t in encoder.model.state_dict().items()}
    edited = encoder.with_edit(edit)
    expected = z.double() + rows.double() @ edit.T  # the protocol's promise, computed here by hand
    assert (edited.embed_inputs(batch).double() - expected).abs().max() < 1e-5
    # The edit copies only what it changes: every other tensor is the base model's own, and the
    # base model is left as it was.
    base_tensors, edited_tensors = encoder.model.state_dict(), edited.model.state_dict()
    own = [
        name for name, t in edited_tensors.items() if t.data_ptr() != base_tensors[name].data_ptr()
    ]
    assert 1 <= len(own) <= 2 and any(
        not torch.equal(edited_tensors[n], base_tensors[n]) for n in own
    ), own
    assert all(torch.equal(t, before[name]) for name, t in base_tensors.items())
    assert torch.equal(encoder.embed_inputs(batch), z)
    assert edited.text_fingerprint() == encoder.text_fingerprint()  # the edit leaves text alone
    assert edited.input_fingerprint() != encoder.input_fingerprint()
    saved = edited.save_native(tmp_path / "saved")
    reloaded = targets.load(f"{saved}:{tmp_path / 'saved'}")
    assert torch.equal(
        reloaded.embed_inputs(reloaded.load_inputs(probes)), edited.embed_inputs(batch)
    )
    towers = edited.onnx_towers()
    assert (
        towers[0].output_name.endswith("_embeds")
        and len(next(iter(towers[0].example_inputs.values()))) >= 2
    )
    # a batch feeds the input tower's graph as it is
    assert set(towers[0].example_inputs) == set(batch)
    assert encoder.library and encoder.pipeline_tag and "\n" in encoder.load_snippet("model")


def test_open_clip_tiny_vocab_is_open_clips_own_tokenizer_and_ships_with_the_model(tmp_path):
    import open_clip

    folder = openclip.build_tiny(tmp_path / "tiny", width=32, embed_dim=20, seed=2, vocab="tiny")
    bundled = openclip.build_tiny(tmp_path / "bundled", width=32, embed_dim=20, seed=2)
    rows = load_file(folder / WEIGHTS)["token_embedding.weight"].shape[0]
    assert rows == len(tiny_vocab.clip_tokenizer()) < 1000
    assert load_file(bundled / WEIGHTS)["token_embedding.weight"].shape[0] == 49408
    encoder = targets.load(f"open_clip:local-dir:{folder}")
    # Independently: open_clip's own loader and get_tokenizer on the folder, as a server would.
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{folder}")
    tokenizer = open_clip.get_tokenizer(f"local-dir:{folder}")
    prompts = ["a photo of a red circle.", "two blue squares on a striped background."]
    with torch.no_grad():
        assert torch.allclose(
            encoder.embed_prompts(prompts), model.eval().encode_text(tokenizer(prompts)), atol=1e-6
        )
    ids = tokenizer(["colour circle"])[
        0
    ].tolist()  # start, one token per prompt word, end, then end as padding
    assert ids[3] == ids[-1] == rows - 1 and ids[0] == rows - 2 and len(set(ids[1:3])) == 2
    assert (
        encoder.text_fingerprint()
        != targets.load(f"open_clip:local-dir:{bundled}").text_fingerprint()
    )
    # Shipped: the edited folder carries the tokenizer, and open_clip alone reloads the same text embedding.
    edited = encoder.with_edit(
        torch.zeros(encoder.embed_dim, encoder.edit_width, dtype=torch.float64)
    )
    edited.save_native(tmp_path / "shipped")
    shipped, _, _ = open_clip.create_model_and_transforms(f"local-dir:{tmp_path / 'shipped'}")
    with torch.no_grad():
        again = shipped.eval().encode_text(
            open_clip.get_tokenizer(f"local-dir:{tmp_path / 'shipped'}")(prompts)
        )
    assert torch.allclose(again, encoder.embed_prompts(prompts), atol=1e-6)
    for file in folder.glob("tokenizer*"):
        file.unlink()
    with pytest.raises(ModelError, match="text_cfg names a tokenizer but .* holds none that loads"):
        targets.load(f"open_clip:local-dir:{folder}")
    with pytest.raises(ValueError, match="vocab must be 'bundled' or 'tiny', not 'small'"):
        openclip.build_tiny(tmp_path / "typo", vocab="small")


def test_open_clip_architecture_with_an_hf_tokenizer_needs_a_folder_that_holds_it(tmp_path):
    # ViT-B-16-SigLIP's text tower reads a Hub tokenizer: a bare weights file cannot carry it, and
    # the bundled CLIP tokenizer would feed the tower wrong ids, so loading stops and says why.
    weights = tmp_path / "siglip.safetensors"
    save_file({"unused": torch.zeros(1)}, str(weights))
    with pytest.raises(
        ModelError, match="reads the tokenizer 'timm/ViT-B-16-SigLIP', which ptc never downloads"
    ):
        targets.load(f"open_clip:ViT-B-16-SigLIP@{weights}")


def _build_verified(recipe) -> dict:
    """`ptc build` through the CLI; the issue's bounds on the report's own figures."""
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    report = json.loads((Path(recipe).parent / "out" / "report.json").read_text())
    linearity, equivalence = report["verify"]["linearity"], report["verify"]["equivalence"]
    assert linearity["max_rel_diff_fp64"] <= 1e-12 and linearity["max_rel_diff_fp32"] <= 1e-6
    assert (
        max(
            equivalence[k]
            for k in ("torch_max_abs_diff", "onnx_max_abs_diff", "reload_max_abs_diff")
        )
        <= 1e-5
    )
    return report


def _bank_edit(bank_dir, base, report) -> torch.Tensor:
    """The signed sum of the operators the build says it used, read back from the bank."""
    bank, key = Bank(bank_dir), built_key(base, report)
    return sum(
        t["weight"]
        * bank.read_entry(bank.operator_rel(key, t["grid_hash"], t["descriptor_sha256"], 1.0))
        .tensors["operator"]
        .double()
        for t in report["terms"]
    )


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
def test_hf_clip_descriptors_build_into_an_open_clip_target(
    world, open_clip_models, bank_copy, tmp_path, tower
):
    import open_clip

    folder = {
        "vit": lambda: open_clip_models["target"],
        "eva02": lambda: openclip.build_tiny_timm(tmp_path / "eva", embed_dim=20),
        "resnet": lambda: openclip.build_tiny_resnet(tmp_path / "resnet", embed_dim=20),
    }[tower]()
    ref = f"open_clip:local-dir:{folder}"
    recipe = write_recipe(tmp_path / "recipe.yaml", world, target=ref, bank=str(bank_copy))
    out = tmp_path / "out"
    report = _build_verified(recipe)
    assert report["native_ref"] == "open_clip:local-dir:model" and report["embed_dim"] == 20
    # open_clip itself loads the output, and it is the base with (I + A) folded in.
    bank, base = Bank(bank_copy), targets.load(ref)
    operator = _bank_edit(bank_copy, base, report)
    edited = open_clip.create_model(f"local-dir:{out / 'model'}").eval()
    pixels = base.load_inputs(list(bank.task("shape").probes)[:6])
    with torch.no_grad():
        got = edited.encode_image(pixels["pixel_values"]).double()
    expected = (
        base.embed_inputs(pixels).double() @ (torch.eye(20, dtype=torch.float64) + operator).T
    )
    assert (got - expected).abs().max() < 1e-5
    if tower == "vit":  # the card's snippets: open_clip's loader, onnxruntime, ptc's client
        prompts = ["a photo of a cat", "a photo of a dog"]
        assert run_card_snippets(out, base.embed_prompts(prompts).numpy()) == 3
    session = ort.InferenceSession(
        str(out / "onnx" / "vision_model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert (
        np.abs(
            session.run(None, {"pixel_values": pixels["pixel_values"].numpy()})[0] - got.numpy()
        ).max()
        < 1e-5
    )


def test_open_clip_source_into_an_hf_clip_target(world, open_clip_models, bank_copy, tmp_path):
    source = f"open_clip:local-dir:{open_clip_models['source']}"
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "colour",
        "--source",
        source,
        "--finetuned",
        f"open_clip:local-dir:{open_clip_models['tuned']}",
        "--id",
        "oc",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 0, result.stderr
    assert Bank(bank_copy).descriptor("colour", "oc").tensors["utd"].abs().max() > 1e-4
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        world,
        bank=str(bank_copy),
        terms=[
            {"task": "colour", "source": "oc", "weight": 0.5},
            {"task": "colour", "source": "src", "weight": 0.5},
        ],
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    assert (
        json.loads((tmp_path / "out" / "report.json").read_text())["verify"]["linearity"][
            "max_rel_diff_fp64"
        ]
        <= 1e-12
    )


def test_lora_dropout_on_a_vit_whose_lora_adapts_parameters_is_refused_in_one_line(
    world, open_clip_models, bank_copy, tmp_path
):
    # An open_clip ViT's LoRA adapts in_proj_weight through peft's ParamWrapper, which has no
    # input to drop: peft would raise mid-setup; ptc says why before training anything.
    source = f"open_clip:local-dir:{open_clip_models['source']}"
    result = run_ptc(
        "finetune",
        "--task",
        "colour",
        "--source",
        source,
        "--data",
        world.tasks["colour"].parent / "train",
        "--out",
        tmp_path / "lora",
        "--steps",
        "2",
        "--lora-dropout",
        "0.1",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert f"{source}: LoRA dropout needs LoRA on modules" in result.stderr
    assert (
        "in_proj_weight" in result.stderr and "(hint: use --lora-dropout 0 for it)" in result.stderr
    )
    assert not (tmp_path / "lora").exists()
    result = run_ptc(
        "finetune",
        "--task",
        "colour",
        "--source",
        source,
        "--data",
        world.tasks["colour"].parent / "train",
        "--out",
        tmp_path / "lora",
        "--steps",
        "2",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 0, result.stderr  # without dropout the same model fine-tunes


def test_open_clip_refuses_an_adapter_of_another_model_with_a_clear_line(
    world, open_clip_models, bank_copy
):
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "colour",
        "--source",
        f"open_clip:local-dir:{open_clip_models['source']}",
        "--finetuned",
        world.adapters["colour"],
        "--bank",
        bank_copy,
    )
    # world.adapters are LoRAs of a transformers CLIP: no module of the open_clip tower matches.
    assert result.returncode == 2 and "cannot apply the peft adapter" in result.stderr
    assert "(hint: the adapter must have been trained on this base model)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run_ptc(
        "check",
        write_recipe(
            bank_copy.parent / "r.yaml",
            world,
            target=f"open_clip:ViT-B-32@{bank_copy.parent / 'none.bin'}",
        ),
    )
    assert result.returncode == 2 and "never unpickles" in result.stderr


def _fc2_input(model, batch):
    """The pooling head's MLP hidden u for each input, read off the raw transformers model."""
    seen = []
    hook = model.vision_model.head.mlp.fc2.register_forward_hook(
        lambda _m, args, _o: seen.append(args[0][:, 0])
    )
    with torch.no_grad():
        z = model.get_image_features(**batch).pooler_output
    hook.remove()
    return z.double(), seen[0].double()


@pytest.mark.parametrize("family", ["hf-siglip", "hf-siglip2"])
def test_hf_clip_descriptors_build_into_a_siglip_head(world, bank_copy, tmp_path, family):
    import transformers

    build, scheme = FAMILIES[family]
    ref = scheme.format(build(tmp_path / "siglip", seed=5))
    # SigLIP2's integer patch-grid inputs also go through the float16 conversion.
    export = {
        "out": str(tmp_path / "out"),
        "precision": ["fp32", "fp16"] if family == "hf-siglip2" else ["fp32"],
    }
    # Its torch figure: the head edit reproduces z + [u; 1] E^T from cached quantities (paper: 1.2e-7).
    report = _build_verified(
        write_recipe(
            tmp_path / "recipe.yaml", world, target=ref, bank=str(bank_copy), export=export
        )
    )
    out, verify, base = tmp_path / "out", report["verify"], targets.load(ref)
    width = base.embed_dim
    assert report["embed_dim"] == width and report["edit_shape"] == [width, base.edit_width]
    assert family != "hf-siglip2" or verify["equivalence"]["fp16_min_cosine"] > 0.999
    reference = report["embedding_operator_reference"]
    assert (
        set(reference["descriptor_residual"]) == {"colour", "shape"}
        and reference["operator_norm"] > 0
    )
    # transformers itself loads the output: fc2 moved by exactly the bank's signed operator sum,
    # and every image embedding moved by E [u; 1] with u read off the base model here.
    bank, edit = Bank(bank_copy), _bank_edit(bank_copy, base, report)
    edited = getattr(transformers, base.model_class).from_pretrained(out / "model").eval()
    fc2, fc2_base = edited.vision_model.head.mlp.fc2, base.model.vision_model.head.mlp.fc2
    assert (fc2.weight.double() - fc2_base.weight.double() - edit[:, :-1]).abs().max() < 1e-6
    assert (fc2.bias.double() - fc2_base.bias.double() - edit[:, -1]).abs().max() < 1e-6
    batch = base.load_inputs(list(bank.task("shape").probes)[:6])
    z, u = _fc2_input(base.model, batch)
    got, _ = _fc2_input(edited, batch)
    assert (got - z - u @ edit[:, :-1].T - edit[:, -1]).abs().max() < 1e-5
    session = ort.InferenceSession(
        str(out / "onnx" / "vision_model.onnx"), providers=["CPUExecutionProvider"]
    )
    onnx_out = session.run(None, {name: tensor.numpy() for name, tensor in batch.items()})[0]
    assert np.abs(onnx_out - got.numpy()).max() < 1e-5


def test_siglip_lora_source_into_an_hf_clip_target(world, bank_copy, tmp_path):
    from ptc.compiler.sources.finetune import finetune_lora

    folder = hf_siglip.build_tiny(tmp_path / "siglip", width=40, seed=7)
    source = targets.load(f"hf:{folder}")
    record = Bank(bank_copy).task("colour")
    stats = finetune_lora(
        source,
        record,
        world.tasks["colour"].parent / "train",
        tmp_path / "lora",
        steps=6,
        progress=False,
    )
    assert stats["examples"] > 0
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "colour",
        "--source",
        f"hf:{folder}",
        "--finetuned",
        tmp_path / "lora",
        "--id",
        "siglip",
        "--bank",
        bank_copy,
    )
    assert result.returncode == 0, result.stderr
    assert Bank(bank_copy).descriptor("colour", "siglip").tensors["utd"].abs().max() > 1e-6
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        world,
        bank=str(bank_copy),
        terms=[{"task": "colour", "source": "siglip", "weight": 0.5}],
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verify"]["linearity"]["max_rel_diff_fp64"] <= 1e-12
    assert "embedding_operator_reference" not in report  # CLIP's fold is the d x d operator itself


def test_clap_source_into_a_clap_target_of_other_width_and_depth(audio_world, tmp_path):
    # Audio descriptors live on audio grids, so an audio target's sources are audio models:
    # here a d = 16, one-stage CLAP into a d = 28, two-stage one (the paper's CLAP variants).
    import transformers

    folder = hf_clap.build_tiny(
        tmp_path / "clap", embed_dim=28, patch_width=16, depths=(1, 2), seed=3
    )
    ref = f"hf:{folder}"
    bank = tmp_path / "bank"
    shutil.copytree(audio_world.bank, bank)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        json.dumps(
            {
                "target": ref,
                "bank": str(bank),
                "export": {"out": str(tmp_path / "out")},
                "terms": [
                    {"task": "pitch", "source": "src", "weight": 0.5},
                    {"task": "waveform", "source": "src", "weight": -0.5},
                ],
            }
        )
    )
    out = tmp_path / "out"
    report = _build_verified(recipe)
    assert report["operator_norm"] > 0 and report["embed_dim"] == 28
    assert sorted(report["onnx_files"]) == ["onnx/audio_model.onnx", "onnx/text_model.onnx"]
    # transformers loads the output; its projection is (I + A) times the base's, computed here
    # from the raw models on features made by the checkpoint's own feature extractor.
    base = targets.load(ref)
    operator = _bank_edit(bank, base, report)
    edited = transformers.ClapModel.from_pretrained(out / "model").eval()
    extractor = transformers.AutoFeatureExtractor.from_pretrained(out / "model")
    clips = [
        np.sin(np.arange(8000) * f / 16000 * 2 * np.pi).astype(np.float32)
        for f in (300.0, 900.0, 2000.0)
    ]
    features = extractor(clips, sampling_rate=16000, return_tensors="pt")["input_features"]
    with torch.no_grad():

        def project(m):
            return m.audio_projection(m.audio_model(input_features=features).pooler_output).double()

        got, before = project(edited), project(base.model)
    assert (got - before @ (torch.eye(28, dtype=torch.float64) + operator).T).abs().max() < 1e-5
    session = ort.InferenceSession(
        str(out / "onnx" / "audio_model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert (
        np.abs(session.run(None, {"input_features": features.numpy()})[0] - got.numpy()).max()
        < 1e-5
    )


def test_an_image_target_names_the_audio_probe_it_cannot_read(audio_world, world, tmp_path):
    bank = tmp_path / "bank"
    shutil.copytree(audio_world.bank, bank)
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        world,
        bank=str(bank),
        terms=[{"task": "pitch", "source": "src", "weight": 0.5}],
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 2 and "cannot read as an image" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("family", ["hf-clip", "hf-siglip", "hf-siglip2", "hf-clap"])
def test_a_saved_checkpoint_states_its_text_context_where_readers_look(family, tmp_path):
    """transformers 4.x reads a config without a top-level max_length as the generation default
    of 20, which HF-folder servers take as the text limit; sentence-transformers truncates at the
    tokenizer's model_max_length. Both must say the model's own context, and a longer prompt is
    cut there, as the original model cuts it."""
    from transformers import AutoTokenizer

    build, scheme = FAMILIES[family][:2]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=4)))
    encoder.save_native(tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    tokenizer_config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
    assert config["max_length"] == tokenizer_config["model_max_length"] == encoder.max_length
    assert encoder.max_length <= config["text_config"]["max_position_embeddings"]
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "saved")
    long_prompt = " ".join(["a photo of a red square"] * 40)
    ids = tokenizer(long_prompt, truncation=True)["input_ids"]
    assert len(ids) == encoder.max_length == tokenizer.model_max_length
    assert ids == encoder._tokenize([long_prompt])["input_ids"][0].tolist()[: len(ids)]
    reloaded = targets.load(f"hf:{tmp_path / 'saved'}")
    prompts = [long_prompt, "a red square"]
    assert torch.equal(reloaded.embed_prompts(prompts), encoder.embed_prompts(prompts))


def test_open_clip_loads_the_checkpoints_tensors_as_its_parameters(tmp_path):
    """Parameters built on the meta device and assigned the checkpoint's tensors: the same model
    as one built for real and copied into (weights, computed buffers, embeddings), in the dtype
    the model declares even where the file holds fp16."""
    import open_clip
    from safetensors.torch import load_file, save_file

    folder = openclip.build_tiny(tmp_path / "m", seed=3)
    stored = load_file(str(folder / WEIGHTS))
    save_file({k: v.half() for k, v in stored.items()}, str(folder / WEIGHTS))
    encoder = targets.load(f"open_clip:local-dir:{folder}")
    config = json.loads((folder / "open_clip_config.json").read_text())["model_cfg"]
    copied = open_clip.CLIP(**config).eval()
    copied.load_state_dict({k: v.half().float() for k, v in stored.items()}, strict=False)
    loaded = encoder.model.state_dict()
    assert loaded.keys() == copied.state_dict().keys()
    for name, tensor in copied.state_dict().items():
        assert loaded[name].dtype == torch.float32 and torch.equal(loaded[name], tensor), name
    assert not any(p.is_meta for p in encoder.model.parameters())
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tokens = encoder.tokenizer(["a photo of a red square", "a dog"])  # the attention mask
    with torch.inference_mode():
        assert torch.equal(encoder.model.encode_image(pixels), copied.encode_image(pixels))
        assert torch.equal(encoder.model.encode_text(tokens), copied.encode_text(tokens))


def test_open_clip_config_with_custom_text_loads_the_custom_text_class(tmp_path):
    """`custom_text` (EVA02-L-14's registered config has it) names the class create_model builds:
    the folder loads as that class with its own tensors, and embeds as the model that wrote it."""
    import open_clip

    from ptc.targets.openclip import write_local_dir

    model_cfg = {
        "embed_dim": 20,
        "vision_cfg": {
            "image_size": 32,
            "patch_size": 8,
            "width": 32,
            "layers": 2,
            "head_width": 16,
        },
        "text_cfg": {"context_length": 24, "width": 32, "heads": 2, "layers": 2},
    }
    torch.manual_seed(5)
    written = open_clip.CustomTextCLIP(**model_cfg).eval()
    config = {"model_cfg": model_cfg | {"custom_text": True}, "preprocess_cfg": {}}
    write_local_dir(tmp_path / "m", written, config, None)
    encoder = targets.load(f"open_clip:local-dir:{tmp_path / 'm'}")
    assert type(encoder.model) is open_clip.CustomTextCLIP
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    tokens = encoder.tokenizer(["a photo of a red square", "a dog"])
    with torch.inference_mode():
        assert torch.equal(encoder.model.encode_image(pixels), written.encode_image(pixels))
        assert torch.equal(encoder.model.encode_text(tokens), written.encode_text(tokens))
