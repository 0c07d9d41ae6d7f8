"""Real-size models built offline from the public architectures' configs, with random weights:
what a real checkpoint costs to embed, edit and export, without downloading one (the numbers it
produces are meaningless; its sizes, shapes and tokenizer are the real ones).

The CLIP BPE tokenizer is the real one: open_clip's wheel ships its vocabulary and merges
(`bpe_simple_vocab_16e6.txt.gz`), from which the transformers CLIPTokenizer files are made.
SigLIP's is a sentencepiece model of the real vocabulary size (32,000) trained here on that
vocabulary's words: its pieces differ from Google's, its cost per prompt does not.
"""

from __future__ import annotations

import gzip
import io
from dataclasses import dataclass
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


# open_clip's registered architectures, built as `open_clip.create_model(name)` does.
OPEN_CLIP_ARCHITECTURES = {"eva02-l14": "EVA02-L-14", "vit-h14": "ViT-H-14"}
# transformers SiglipConfig fields of google/siglip-so400m-patch14-384 (NOTES-real-size.md).
SO400M = dict(
    hidden_size=1152, intermediate_size=4304, num_hidden_layers=27, num_attention_heads=16
)
# The tokenizer's ids (sentencepiece_model), not the public config's CLIP-era ones.
SIGLIP_TEXT = dict(
    vocab_size=32000, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2
)
SIGLIP_CONFIGS = {
    "siglip-so400m": dict(
        vision={**SO400M, "patch_size": 14, "image_size": 384}, text={**SO400M, **SIGLIP_TEXT}
    ),
    # The real tokenizer and image size on 2-layer, 64-wide towers: so400m's build at tiny cost.
    "siglip-tiny14": dict(
        vision={**VISION_TINY, "patch_size": 14, "image_size": 384},
        text={**TEXT_TINY, **SIGLIP_TEXT},
    ),
}
NAMES = (*CONFIGS, *OPEN_CLIP_ARCHITECTURES, *SIGLIP_CONFIGS)


@dataclass(frozen=True)
class RealModel:
    """A saved real-size model: the reference a recipe names, and its checkpoint file."""

    ref: str
    weights: Path


def build(folder: Path, name: str, seed: int = 0) -> RealModel:
    """Save a random-weight model of the named real architecture (any of NAMES) in its family's
    native layout, with its tokenizer and image processor."""
    from ptc import targets

    if name in CONFIGS:
        build_clip(folder, name, seed)
    elif name in OPEN_CLIP_ARCHITECTURES:
        _save_open_clip(folder, name, seed)
    elif name in SIGLIP_CONFIGS:
        _save_siglip(folder, name, seed)
    else:
        raise KeyError(f"no real-size architecture {name!r}; known: {', '.join(NAMES)}")
    scheme = "open_clip:local-dir" if name in OPEN_CLIP_ARCHITECTURES else "hf"
    ref = f"{scheme}:{folder}"
    weights = next(p for p in folder.glob("*.safetensors") if not p.name.startswith("adapter"))
    targets.check(ref)
    return RealModel(ref, weights)


def architecture(name: str) -> torch.nn.Module:
    """The named architecture, randomly initialised on the current default device (under
    `torch.device("meta")` it costs nothing: how the tests count its parameters)."""
    if name in CONFIGS:
        from transformers import CLIPModel

        return CLIPModel(_clip_config(name, len(clip_bpe_tokenizer().get_vocab())))
    if name in OPEN_CLIP_ARCHITECTURES:
        import open_clip

        # open_clip moves what it builds to `device`: the default one, not always the CPU.
        device = torch.empty(0).device
        return open_clip.create_model(OPEN_CLIP_ARCHITECTURES[name], pretrained=None, device=device)
    from transformers import SiglipConfig, SiglipModel

    config = SIGLIP_CONFIGS[name]
    return SiglipModel(SiglipConfig(text_config=config["text"], vision_config=config["vision"]))


def _save_open_clip(folder: Path, name: str, seed: int) -> None:
    import open_clip

    from ptc.targets.openclip import write_local_dir

    torch.manual_seed(seed)
    model = architecture(name).eval()
    model_cfg = open_clip.get_model_config(OPEN_CLIP_ARCHITECTURES[name])
    write_local_dir(folder, model, {"model_cfg": model_cfg, "preprocess_cfg": {}}, None)


def _save_siglip(folder: Path, name: str, seed: int) -> None:
    from transformers import SiglipImageProcessor, SiglipTokenizer
    from transformers.utils import logging

    from ptc.targets.hf_siglip import HFSiglip

    logging.disable_progress_bar()
    config = SIGLIP_CONFIGS[name]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spiece.model").write_bytes(sentencepiece_model(config["text"]["vocab_size"]))
    tokenizer = SiglipTokenizer(
        vocab_file=str(folder / "spiece.model"),
        model_max_length=config["text"]["max_position_embeddings"],
    )
    torch.manual_seed(seed)
    model = architecture(name).eval()
    size = config["vision"]["image_size"]
    processor = SiglipImageProcessor(size={"height": size, "width": size})
    HFSiglip(model, tokenizer, processor, ref=f"real-size:{name}").save_native(folder)


def _clip_words() -> list[str]:
    """The CLIP vocabulary's merged pieces as plain text: about 48,000 fragments of English."""
    import open_clip.tokenizer as oc_tokenizer

    lines = gzip.open(oc_tokenizer.default_bpe()).read().decode("utf-8").split("\n")
    return ["".join(line.split()).replace("</w>", "") for line in lines[1 : 49152 - 256 - 2 + 1]]


def sentencepiece_model(vocab_size: int) -> bytes:
    """A sentencepiece unigram model (as SigLIP's) of exactly `vocab_size` pieces (SigLIP's ids:
    pad 0, eos 1, unk 2), trained offline on the CLIP vocabulary's words, with byte fallback.
    On the words alone unigram training tops out near 20,000 pieces: they go in three times,
    shuffled, and twice more joined in pairs (about 10 seconds on 2 cores)."""
    import random

    import sentencepiece as spm

    words, rng, sentences = _clip_words(), random.Random(0), []
    for _ in range(3):
        rng.shuffle(words)
        sentences += [" ".join(words[i : i + 12]) for i in range(0, len(words), 12)]
    for _ in range(2):
        rng.shuffle(words)
        pairs = [a + b for a, b in zip(words[::2], words[1::2])]
        sentences += [" ".join(pairs[i : i + 12]) for i in range(0, len(pairs), 12)]
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=proto,
        vocab_size=vocab_size,
        model_type="unigram",
        byte_fallback=True,
        character_coverage=1.0,
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        num_threads=2,
        minloglevel=2,
    )
    return proto.getvalue()


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


def _clip_config(name: str, vocab_size: int, **special_tokens: int):
    from transformers import CLIPConfig

    config = CONFIGS[name]
    text = dict(config["text"], vocab_size=vocab_size, max_position_embeddings=77, **special_tokens)
    return CLIPConfig(
        text_config=text, vision_config=config["vision"], projection_dim=config["projection_dim"]
    )


def build_clip(folder: Path, name: str, seed: int = 0) -> Path:
    """Save a random-weight transformers CLIPModel of the named real architecture (`CONFIGS`),
    its real tokenizer and a 224 px image processor, as save_pretrained does."""
    from transformers import CLIPImageProcessor, CLIPModel
    from transformers.utils import logging

    from ptc.targets.hf_clip import HFClip

    logging.disable_progress_bar()
    tokenizer = clip_bpe_tokenizer()
    vocab = tokenizer.get_vocab()
    config = _clip_config(
        name,
        len(vocab),
        bos_token_id=vocab["<|startoftext|>"],
        eos_token_id=vocab["<|endoftext|>"],
        pad_token_id=vocab["<|endoftext|>"],
    )
    torch.manual_seed(seed)
    model = CLIPModel(config).eval()
    size = CONFIGS[name]["vision"]["image_size"]
    processor = CLIPImageProcessor(
        size={"shortest_edge": size}, crop_size={"height": size, "width": size}
    )
    HFClip(model, tokenizer, processor, ref=f"real-size:{name}").save_native(folder)
    return folder
