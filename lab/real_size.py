"""Real-size models built offline from the public architectures' configs, with random weights:
what a real checkpoint costs to embed, edit and export, without downloading one (the numbers it
produces are meaningless; its sizes, shapes and tokenizer are the real ones).

The CLIP BPE tokenizer is the real one: open_clip's wheel ships its vocabulary and merges
(`bpe_simple_vocab_16e6.txt.gz`), from which the transformers CLIPTokenizer files are made.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import torch

# transformers config fields of the public checkpoints (NOTES-real-size.md).
CLIP_TEXT_B = dict(
    hidden_size=512, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=8
)
CLIP_TEXT_L = dict(
    hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12
)
VISION_B = dict(
    hidden_size=768,
    intermediate_size=3072,
    num_hidden_layers=12,
    num_attention_heads=12,
    image_size=224,
)
VISION_L = dict(
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=24,
    num_attention_heads=16,
    image_size=224,
)

VISION_TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    image_size=224,
)
TEXT_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2)

CONFIGS = {
    # The real tokenizer and image size on a 2-layer, 64-wide tower: the same build at tiny cost.
    "vit-tiny16": dict(vision={**VISION_TINY, "patch_size": 16}, text=TEXT_TINY, projection_dim=64),
    "vit-tiny32": dict(vision={**VISION_TINY, "patch_size": 32}, text=TEXT_TINY, projection_dim=64),
    "vit-b32": dict(vision={**VISION_B, "patch_size": 32}, text=CLIP_TEXT_B, projection_dim=512),
    "vit-b16": dict(vision={**VISION_B, "patch_size": 16}, text=CLIP_TEXT_B, projection_dim=512),
    "vit-l14": dict(vision={**VISION_L, "patch_size": 14}, text=CLIP_TEXT_L, projection_dim=768),
}


def clip_bpe_tokenizer():
    """transformers' CLIPTokenizer on the real CLIP vocabulary (49,408 tokens), read from the
    copy open_clip ships; the same tokens and ids as open_clip's SimpleTokenizer."""
    import open_clip.tokenizer as oc_tokenizer
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    lines = gzip.open(oc_tokenizer.default_bpe()).read().decode("utf-8").split("\n")
    merges = [tuple(line.split()) for line in lines[1 : 49152 - 256 - 2 + 1]]
    symbols = list(bytes_to_unicode().values())
    tokens = symbols + [s + "</w>" for s in symbols] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    vocab = {token: i for i, token in enumerate(tokens)}
    return CLIPTokenizer(vocab=vocab, merges=merges)


def build_clip(folder: Path, name: str, seed: int = 0) -> Path:
    """Save a random-weight transformers CLIPModel of the named real architecture (`CONFIGS`),
    its real tokenizer and a 224 px image processor, as save_pretrained does."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    from transformers.utils import logging

    from ptc.targets.hf_clip import HFClip

    logging.disable_progress_bar()
    config = CONFIGS[name]
    tokenizer = clip_bpe_tokenizer()
    vocab = tokenizer.get_vocab()
    text = dict(
        config["text"],
        vocab_size=len(vocab),
        max_position_embeddings=77,
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )
    torch.manual_seed(seed)
    model = CLIPModel(
        CLIPConfig(
            text_config=text,
            vision_config=config["vision"],
            projection_dim=config["projection_dim"],
        )
    ).eval()
    size = config["vision"]["image_size"]
    processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    HFClip(model, tokenizer, processor, ref=f"real-size:{name}").save_native(folder)
    return folder
