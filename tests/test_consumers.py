"""What an edit's users load it with, tried as they use it: sentence-transformers reads the
`model/` folder of a transformers edit as it is, and must give the embeddings the build
verified, long prompts included."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from conftest import clip_pixels
from ptc import targets
from ptc.lab.tiny import hf_siglip

sentence_transformers = pytest.importorskip("sentence_transformers")

LONG_PROMPT = " ".join(["a photo of a small red square on a blue background"] * 12)


def _encode(model, items) -> torch.Tensor:
    return model.encode(items, convert_to_tensor=True, normalize_embeddings=False).cpu()


def _edited_in_sentence_transformers(encoder, folder: Path):
    """A random edit of `encoder`, saved natively to `folder` and loaded by the library."""
    edit = 0.05 * torch.randn(
        encoder.embed_dim, encoder.edit_width, generator=torch.Generator().manual_seed(0)
    )
    edited = encoder.with_edit(edit)
    edited.save_native(folder)
    return edited, sentence_transformers.SentenceTransformer(str(folder), device="cpu")


def test_a_clip_edit_loads_in_sentence_transformers_to_the_verified_embeddings(world, built):
    out, _ = built
    model = sentence_transformers.SentenceTransformer(str(out / "model"), device="cpu")
    probes = sorted((world.tasks["colour"].parent / "test").rglob("*.png"))[:4]
    images = _encode(model, [Image.open(p).convert("RGB") for p in probes])
    # the shipped ONNX vision tower, which the build held to the edited model within 1e-5
    import onnxruntime as ort

    session = ort.InferenceSession(str(out / "onnx" / "vision_model.onnx"))
    graph = session.run(None, {"pixel_values": clip_pixels(probes, out / "model").numpy()})[0]
    assert np.abs(images.numpy() - graph).max() <= 1e-5
    reloaded = targets.load(f"hf:{out / 'model'}")
    prompts = ["a red square", LONG_PROMPT]
    texts = _encode(model, prompts)
    assert (texts - reloaded.embed_prompts(prompts)).abs().max() <= 1e-5


def test_a_siglip_edit_loads_in_sentence_transformers_to_its_own_embeddings(world, tmp_path):
    encoder = targets.load(f"hf:{hf_siglip.build_tiny(tmp_path / 'siglip', width=40, seed=4)}")
    edited, model = _edited_in_sentence_transformers(encoder, tmp_path / "edited")
    probes = sorted((world.tasks["colour"].parent / "test").rglob("*.png"))[:4]
    images = _encode(model, [Image.open(p).convert("RGB") for p in probes])
    expected = edited.embed_inputs(edited.load_inputs([Path(p) for p in probes]))
    assert (images - expected).abs().max() <= 1e-5
    assert (images - encoder.embed_inputs(encoder.load_inputs(probes))).abs().max() > 1e-3  # edited
    prompts = ["a red square", LONG_PROMPT]
    assert (_encode(model, prompts) - edited.embed_prompts(prompts)).abs().max() <= 1e-5


def test_a_clap_edit_loads_in_sentence_transformers_to_its_embeddings_normalised(tmp_path):
    """sentence-transformers runs CLAP through get_text_features and get_audio_features, which
    L2-normalise; the edit's towers return the projection before that. The same directions,
    so the same cosines and the same zero-shot predictions."""
    import soundfile

    from ptc.lab.tiny import hf_clap

    encoder = targets.load(f"hf:{hf_clap.build_tiny(tmp_path / 'clap', embed_dim=20, seed=4)}")
    edited, model = _edited_in_sentence_transformers(encoder, tmp_path / "edited")
    rate = encoder.processor.sampling_rate
    waves = [np.sin(np.arange(rate) / k).astype(np.float32) for k in (5.0, 11.0, 23.0)]
    for index, wave in enumerate(waves):
        soundfile.write(str(tmp_path / f"{index}.wav"), wave, rate, subtype="FLOAT")
    clips = _encode(model, [{"array": wave, "sampling_rate": rate} for wave in waves])
    expected = edited.embed_inputs(edited.load_inputs(sorted(tmp_path.glob("*.wav"))))

    def unit(rows: torch.Tensor) -> torch.Tensor:
        return rows / rows.norm(dim=-1, keepdim=True)

    assert (unit(clips) - unit(expected)).abs().max() <= 1e-5
    assert (
        unit(expected)
        - unit(encoder.embed_inputs(encoder.load_inputs(sorted(tmp_path.glob("*.wav")))))
    ).abs().max() > 1e-3  # edited
    prompts = ["the sound of a bell", LONG_PROMPT]
    texts = _encode(model, prompts)
    assert (unit(texts) - unit(edited.embed_prompts(prompts))).abs().max() <= 1e-5
