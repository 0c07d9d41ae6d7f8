"""The real-size architectures `ptc bench --size` builds are the public ones: their parameter
counts match the published figures, counted on the meta device (no memory, no weights)."""

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
