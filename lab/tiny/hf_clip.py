"""A tiny transformers CLIPModel."""

from __future__ import annotations

from pathlib import Path

import torch

from ptc.lab.tiny_vocab import clip_tokenizer
from ptc.targets.hf_clip import HFClip


def build_tiny(
    folder: Path,
    *,
    width: int = 32,
    embed_dim: int = 24,
    layers: int = 2,
    heads: int = 2,
    image_size: int = 32,
    patch_size: int = 8,
    seed: int = 0,
) -> Path:
    """Save a small random-weight CLIPModel with a real (byte-level BPE, merges trained on prompt
    English: tiny_vocab) CLIP tokenizer and image processor, built offline from configs: for
    tests, the demo and the zoo."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    from transformers.utils import logging

    logging.disable_progress_bar()

    tokenizer = clip_tokenizer()
    vocab = tokenizer.get_vocab()
    eos = vocab["<|endoftext|>"]
    # CLIP pools the EOS position; with eos_token_id == 2 it would fall back to argmax(ids).
    text = dict(
        vocab_size=len(vocab),
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=64,
        eos_token_id=eos,
        bos_token_id=vocab["<|startoftext|>"],
        pad_token_id=eos,
    )
    vision = dict(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        image_size=image_size,
        patch_size=patch_size,
    )
    torch.manual_seed(seed)
    model = CLIPModel(
        CLIPConfig(text_config=text, vision_config=vision, projection_dim=embed_dim)
    ).eval()
    processor = CLIPImageProcessor(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    HFClip(model, tokenizer, processor, ref="tiny").save_native(folder)
    return folder
