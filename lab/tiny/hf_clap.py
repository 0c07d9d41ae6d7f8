"""A tiny transformers ClapModel."""

from __future__ import annotations

from pathlib import Path

import torch

from ptc.lab.tiny_vocab import byte_bpe, extend_vocab
from ptc.targets.hf_clap import HFClap


def build_tiny(
    folder: Path,
    *,
    embed_dim: int = 24,
    patch_width: int = 16,
    depths: tuple[int, ...] = (1, 1),
    text_width: int = 32,
    text_layers: int = 2,
    heads: int = 2,
    sampling_rate: int = 16000,
    mel_bins: int = 16,
    seed: int = 0,
) -> Path:
    """Save a small random-weight ClapModel (HTSAT audio tower, RoBERTa text tower) with a
    byte-level BPE RobertaTokenizer and a ClapFeatureExtractor (1 s window), all offline."""
    from transformers import ClapConfig, ClapFeatureExtractor, ClapModel, RobertaTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.utils import logging

    logging.disable_progress_bar()
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    vocab.update({symbol: 4 + i for i, symbol in enumerate(bytes_to_unicode().values())})
    words, merges = byte_bpe(space_prefix="\u0120")  # GPT-2's byte for a space: "Ġ"
    extend_vocab(vocab, words)
    vocab["<mask>"] = len(vocab)
    tokenizer = RobertaTokenizer(vocab=vocab, merges=list(merges), model_max_length=64)
    # Swin doubles the width at every stage after the first: the pooled width follows.
    audio_width = patch_width * 2 ** (len(depths) - 1)
    audio = dict(
        spec_size=64,
        num_mel_bins=mel_bins,
        window_size=4,
        patch_size=4,
        patch_stride=(4, 4),
        patch_embeds_hidden_size=patch_width,
        hidden_size=audio_width,
        depths=list(depths),
        num_attention_heads=[heads] * len(depths),
        projection_dim=embed_dim,
        enable_fusion=False,
    )
    text = dict(
        vocab_size=len(vocab),
        hidden_size=text_width,
        intermediate_size=2 * text_width,
        num_hidden_layers=text_layers,
        num_attention_heads=heads,
        max_position_embeddings=66,
        projection_dim=embed_dim,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
    )
    torch.manual_seed(seed)
    model = ClapModel(
        ClapConfig(text_config=text, audio_config=audio, projection_dim=embed_dim)
    ).eval()
    extractor = ClapFeatureExtractor(
        feature_size=mel_bins,
        sampling_rate=sampling_rate,
        hop_length=sampling_rate // 100,
        max_length_s=1,
        fft_window_size=sampling_rate // 40,
        frequency_max=sampling_rate // 2,
        truncation="rand_trunc",
        padding="repeatpad",
    )
    HFClap(model, tokenizer, extractor, ref="tiny").save_native(folder)
    return folder
