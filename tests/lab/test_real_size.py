"""The real-size architectures `ptc bench --size` builds are the public ones: their parameter
counts match the published figures, counted on the meta device (no memory, no weights)."""

import numpy as np
import pytest
import torch

from ptc.lab import real_size
from ptc.lab.benchmarks.real_size import SIZES

# Published parameter counts, in millions: open_clip's model table (ViT-H-14, EVA02-L-14),
# the transformers model cards (CLIP ViT-B/32, B/16, L/14; SigLIP so400m-patch14-384).
PUBLISHED_MILLIONS = {
    "vit-b32": 151.28,
    "vit-b16": 149.62,
    "vit-l14": 427.62,
    "eva02-l14": 427.76,
    "vit-h14": 986.11,
    "siglip-so400m": 877.96,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_MILLIONS))
def test_each_real_architecture_has_its_published_parameter_count(name):
    with torch.device("meta"):
        model = real_size.architecture(name)
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    assert millions == pytest.approx(PUBLISHED_MILLIONS[name], abs=0.01)


def test_every_bench_size_names_buildable_architectures_and_a_cli_choice():
    from ptc.lab.cli import REAL_SIZES

    assert set(REAL_SIZES) == set(SIZES)
    for size in SIZES.values():
        assert {size.target, size.source} <= set(real_size.NAMES)
        assert 0 < size.bf16_inputs <= size.probes


def test_an_unknown_architecture_is_refused_with_the_known_names(tmp_path):
    with pytest.raises(KeyError, match="vit-h14"):
        real_size.build(tmp_path, "vit-g14")


def test_the_32k_sentencepiece_tokenizer_serves_as_the_family_tokenises(tmp_path):
    """so400m's tokenizer, on tiny towers: exactly 32,000 pieces, and the serving contract's
    tokenizer.json gives the family's own ids, a prompt past the 64-token context included."""
    from ptc import targets
    from ptc.compiler.export.onnx_graph import export_onnx
    from ptc.compiler.export.serving import LONG_PROMPT, token_agreement, write_contract
    from ptc.compiler.serve.client import OnnxClient

    model = real_size.build(tmp_path / "model", "siglip-tiny14")
    encoder = targets.load(model.ref)
    assert len(encoder.tokenizer) == 32000
    towers = encoder.onnx_towers()
    for tower in towers:
        export_onnx(tower, tmp_path / "onnx" / f"{tower.name}.onnx")
    write_contract(encoder.serving_spec(), towers, tmp_path / "onnx")
    client = OnnxClient(tmp_path / "onnx")
    prompts = [
        "a photo of a small red square.",
        "an image of object 7.",
        "Zebra's café!",
        LONG_PROMPT,
    ]
    assert token_agreement(client.token_arrays(prompts), encoder.prompt_tokens(prompts)).all()
    served = client.embed_texts(prompts)
    assert np.abs(served - encoder.embed_prompts(prompts).numpy()).max() <= 1e-5
