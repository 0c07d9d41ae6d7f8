"""Tiny transformers SiglipModel and Siglip2Model."""

from __future__ import annotations

from pathlib import Path

import torch

from ptc.lab.tiny_vocab import PROMPT_WORDS
from ptc.targets.hf_siglip import HFSiglip, HFSiglip2


def _tiny_config(
    config_class, vocab_size: int, width: int, layers: int, heads: int, max_length: int, **vision
):
    text = dict(
        vocab_size=vocab_size,
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        max_position_embeddings=max_length,
        projection_size=width,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    vision = dict(
        hidden_size=width,
        intermediate_size=2 * width,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        **vision,
    )
    return config_class(text_config=text, vision_config=vision)


def build_tiny(
    folder: Path,
    *,
    width: int = 32,
    layers: int = 2,
    heads: int = 2,
    image_size: int = 32,
    patch_size: int = 8,
    context_length: int = 32,
    seed: int = 0,
) -> Path:
    """Save a small random-weight SiglipModel (embedding width = `width`) with a real
    sentencepiece SiglipTokenizer trained here on prompt English (tiny_vocab) and a
    SiglipImageProcessor, all offline. Prompts pad to `context_length` tokens, as SigLIP's do."""
    import io

    import sentencepiece as spm
    from transformers import SiglipConfig, SiglipImageProcessor, SiglipModel, SiglipTokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    folder.mkdir(parents=True, exist_ok=True)
    rng = torch.Generator().manual_seed(seed)
    sentences = [
        " ".join(
            PROMPT_WORDS[int(i)] for i in torch.randint(len(PROMPT_WORDS), (8,), generator=rng)
        )
        for _ in range(2000)
    ]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=proto,
        vocab_size=256 + 4 * len(PROMPT_WORDS),
        model_type="unigram",
        byte_fallback=True,
        hard_vocab_limit=False,
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    (folder / "spiece.model").write_bytes(proto.getvalue())
    tokenizer = SiglipTokenizer(
        vocab_file=str(folder / "spiece.model"), model_max_length=context_length
    )
    torch.manual_seed(seed)
    model = SiglipModel(
        _tiny_config(
            SiglipConfig,
            len(tokenizer),
            width,
            layers,
            heads,
            context_length,
            image_size=image_size,
            patch_size=patch_size,
        )
    ).eval()
    processor = SiglipImageProcessor(size={"height": image_size, "width": image_size})
    HFSiglip(model, tokenizer, processor, ref="tiny").save_native(folder)
    return folder


def build_tiny2(
    folder: Path,
    *,
    width: int = 32,
    layers: int = 2,
    heads: int = 2,
    patch_size: int = 8,
    max_num_patches: int = 16,
    context_length: int = 32,
    seed: int = 0,
) -> Path:
    """Save a small random-weight Siglip2Model with a byte-fallback Gemma-style Siglip2Tokenizer
    and a NaFlex Siglip2ImageProcessor, all offline."""
    from transformers import Siglip2Config, Siglip2ImageProcessor, Siglip2Model, Siglip2Tokenizer
    from transformers.utils import logging

    logging.disable_progress_bar()
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<mask>": 4}
    vocab.update({f"<0x{i:02X}>": 5 + i for i in range(256)})
    vocab.update(
        {f"\u2581{word}": len(vocab) + i for i, word in enumerate(dict.fromkeys(PROMPT_WORDS))}
    )
    tokenizer = Siglip2Tokenizer(vocab=vocab, merges=[], model_max_length=context_length)
    torch.manual_seed(seed)
    model = Siglip2Model(
        _tiny_config(
            Siglip2Config,
            len(vocab),
            width,
            layers,
            heads,
            context_length,
            num_patches=max_num_patches,
            patch_size=patch_size,
        )
    ).eval()
    processor = Siglip2ImageProcessor(patch_size=patch_size, max_num_patches=max_num_patches)
    HFSiglip2(model, tokenizer, processor, ref="tiny").save_native(folder)
    return folder
