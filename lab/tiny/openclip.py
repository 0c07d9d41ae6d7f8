"""Tiny open_clip CLIPs (ViT, ModifiedResNet, timm towers) in open_clip's local-dir layout, and
the lab's own small timm EVA02 towers (the zoo's EVA-CLIP member)."""

from __future__ import annotations

from pathlib import Path

import torch

from ptc.lab.tiny_vocab import clip_tokenizer
from ptc.targets.openclip import write_local_dir

# text_cfg.hf_tokenizer_name of a tiny-vocabulary model: any non-empty name makes open_clip's
# get_tokenizer load the tokenizer saved in a local-dir folder; this one says whose it is.
TINY_TOKENIZER = "ptc/tiny-vocab"
# Small timm towers (the zoo's EVA02, as EVA-CLIP). A timm name fixes an architecture's size and
# open_clip's config passes a timm tower no size arguments, so these are registered with timm
# under names of the lab's own (register_timm_towers, run by the lab's plugin before open_clip
# builds a model). Separate q/k/v projections (qkv_fused off) put the paper's q/v LoRA on real
# modules. The committed zoo:eva's is w64; w96 is the wide-1.5 trial's (benchmarks/rebuild_trial.py).
TIMM_TOWERS = {
    f"ptc_eva02_w{width}_d4_p4_32": {
        "img_size": 32,
        "patch_size": 4,
        "embed_dim": width,
        "depth": 4,
        "num_heads": 4,
        "mlp_ratio": 4 * 2 / 3,
        "swiglu_mlp": True,
        "qkv_fused": False,
        "use_rot_pos_emb": True,
        "ref_feat_shape": (8, 8),
    }
    for width in (64, 96)
}


def register_timm_towers() -> None:
    """Register TIMM_TOWERS in timm's (global) registry; a second call does nothing."""
    from timm.models import build_model_with_cfg, eva, is_model, register_model

    from ptc.errors import ModelError

    def factory(name: str, size: dict):
        def create(pretrained: bool = False, **kwargs):
            if pretrained:
                raise ModelError(
                    f"timm tower {name}: the lab's small towers have no pretrained weights"
                )
            # timm's own EVA02 recipe, with the tiny variant's metadata and these sizes.
            return build_model_with_cfg(
                eva.Eva, "eva02_tiny_patch14_224", pretrained=False, **{**size, **kwargs}
            )

        create.__name__ = create.__qualname__ = name
        return create

    for name, size in TIMM_TOWERS.items():
        if not is_model(name):
            register_model(factory(name, size))


def _text_cfg(width: int, heads: int, layers: int, context_length: int) -> dict:
    return {
        "context_length": context_length,
        "vocab_size": 49408,
        "width": width,
        "heads": heads,
        "layers": layers,
    }


def save_tiny(folder: Path, model_cfg: dict, seed: int, vocab: str = "bundled") -> Path:
    """Save a random-weight open_clip CLIP built from `model_cfg` in the local-dir layout: for
    tests, benchmarks and the zoo. vocab="bundled" keeps open_clip's 49,408-token vocabulary,
    whose table is most of a tiny model's weights though a generated world's captions use a few
    dozen tokens; vocab="tiny" saves the word-level tokenizer of the tiny transformers CLIP
    (tiny_vocab) into the folder, where open_clip's own get_tokenizer finds it."""
    import open_clip

    if vocab not in ("bundled", "tiny"):
        raise ValueError(f"vocab must be 'bundled' or 'tiny', not {vocab!r}")
    tokenizer = clip_tokenizer() if vocab == "tiny" else None
    if tokenizer is not None:
        text_cfg = model_cfg["text_cfg"] | {
            "vocab_size": len(tokenizer),
            "hf_tokenizer_name": TINY_TOKENIZER,
        }
        model_cfg = model_cfg | {"text_cfg": text_cfg}
    register_timm_towers()
    torch.manual_seed(seed)
    write_local_dir(
        folder,
        open_clip.CLIP(**model_cfg).eval(),
        {"model_cfg": model_cfg, "preprocess_cfg": {}},
        tokenizer,
    )
    return folder


def build_tiny(
    folder: Path,
    *,
    width: int = 32,
    embed_dim: int = 20,
    layers: int = 2,
    heads: int = 2,
    image_size: int = 32,
    patch_size: int = 8,
    context_length: int = 24,
    seed: int = 0,
    vocab: str = "bundled",
) -> Path:
    """A tiny open_clip ViT (projection: the bare visual.proj parameter)."""
    vision = {
        "image_size": image_size,
        "layers": layers,
        "width": width,
        "patch_size": patch_size,
        "head_width": width // heads,
    }
    return save_tiny(
        folder,
        {
            "embed_dim": embed_dim,
            "vision_cfg": vision,
            "text_cfg": _text_cfg(width, heads, layers, context_length),
        },
        seed,
        vocab,
    )


def build_tiny_resnet(
    folder: Path,
    *,
    width: int = 8,
    embed_dim: int = 16,
    image_size: int = 64,
    context_length: int = 24,
    seed: int = 0,
    vocab: str = "bundled",
) -> Path:
    """A tiny open_clip ModifiedResNet (projection: the attention pool's c_proj, with bias)."""
    vision = {"image_size": image_size, "layers": [1, 1, 1, 1], "width": width, "head_width": width}
    return save_tiny(
        folder,
        {
            "embed_dim": embed_dim,
            "vision_cfg": vision,
            "text_cfg": _text_cfg(32, 2, 2, context_length),
        },
        seed,
        vocab,
    )


def build_tiny_timm(
    folder: Path,
    *,
    timm_model: str = "eva02_tiny_patch14_224",
    embed_dim: int = 24,
    context_length: int = 24,
    seed: int = 0,
    vocab: str = "bundled",
) -> Path:
    """An open_clip CLIP whose image tower is a timm model (EVA02 by default, as EVA-CLIP),
    with a linear head projection."""
    vision = {
        "timm_model_name": timm_model,
        "timm_model_pretrained": False,
        "timm_pool": "token",
        "timm_proj": "linear",
        "image_size": 224,
    }
    return save_tiny(
        folder,
        {
            "embed_dim": embed_dim,
            "vision_cfg": vision,
            "text_cfg": _text_cfg(32, 2, 2, context_length),
        },
        seed,
        vocab,
    )


def build_tiny_eva(
    folder: Path,
    *,
    tower: str = "ptc_eva02_w64_d4_p4_32",
    embed_dim: int = 72,
    text_width: int = 64,
    text_layers: int = 4,
    heads: int = 4,
    context_length: int = 24,
    seed: int = 0,
    vocab: str = "bundled",
) -> Path:
    """An open_clip CLIP with one of TIMM_TOWERS (an EVA02) as its image tower, class-token pooled,
    with a linear head projection (the edit site, `visual.head.proj`)."""
    vision = {
        "timm_model_name": tower,
        "timm_model_pretrained": False,
        "timm_pool": "token",
        "timm_proj": "linear",
        "image_size": TIMM_TOWERS[tower]["img_size"],
    }
    return save_tiny(
        folder,
        {
            "embed_dim": embed_dim,
            "vision_cfg": vision,
            "text_cfg": _text_cfg(text_width, heads, text_layers, context_length),
        },
        seed,
        vocab,
    )
