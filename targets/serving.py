"""A family describing itself to an ONNX-only client: its preprocessing as data and its
tokenizer as one `tokenizers` file with the family's truncation and padding set. The records
are the serving contract's (`ptc/compiler/serve/contract.py` documents and reads them); the
compiler checks them against the family's own preprocessing and tokenizer at build time."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ptc.errors import OutputError

# PIL's resampling numbers (what HF processor configs store) -> the contract's names
INTERPOLATIONS = {0: "nearest", 2: "bilinear", 3: "bicubic"}


@dataclass(frozen=True)
class ServingSpec:
    """What an ONNX-only client needs besides the graphs: how a file becomes the input tower's
    inputs (`preprocessing`, a record of the contract's), how a prompt becomes the text tower's
    (`tokenizer_json`: a `tokenizers` file that truncates and pads as the family does), and the
    text graph's input names in order."""

    preprocessing: dict[str, Any]
    tokenizer_json: str
    context_length: int
    padding: str  # "longest" (to the batch's longest prompt) or "max_length" (to the context)
    pad_id: int
    text_inputs: tuple[str, ...]
    padding_side: str = "right"  # where pads go ("left": SigLIP2, which pools the last token)
    truncation_side: str = "right"  # which end a prompt past the context loses


def interpolation_name(resample: Any, ref: str) -> str:
    name = INTERPOLATIONS.get(int(resample))
    if name is None:
        raise OutputError(
            f"{ref}: its processor resizes with PIL resampling {resample}, which the serving "
            "contract does not describe",
            f"save the processor with one of: {', '.join(INTERPOLATIONS.values())}",
        )
    return name


def image_record(
    *,
    input_name: str,
    resize: dict[str, Any] | None,
    interpolation: str,
    center_crop: dict[str, Any] | None,
    rescale: float,
    mean: list[float],
    std: list[float],
) -> dict[str, Any]:
    """A fixed-size image input: resized, centre-cropped, scaled and normalised, NCHW float32."""
    return {
        "kind": "image",
        "input": input_name,
        "color": "RGB",
        "resize": resize,
        "interpolation": interpolation,
        "center_crop": center_crop,
        "rescale": float(rescale),
        "mean": [float(m) for m in mean],
        "std": [float(s) for s in std],
        "layout": "NCHW",
    }


def with_rules(
    tokenizer_json: str,
    context_length: int,
    padding: str,
    pad: tuple[int, str],
    sides: tuple[str, str] = ("right", "right"),
) -> str:
    """`tokenizer_json` with the family's truncation (at the context, end token kept) and padding
    (`pad`: id and token; `sides`: padding's and truncation's) written in, so that
    `Tokenizer.from_file(...).encode_batch(prompts)` gives the graph's inputs."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokenizer.enable_truncation(max_length=context_length, direction=sides[1])
    length = context_length if padding == "max_length" else None
    tokenizer.enable_padding(direction=sides[0], pad_id=pad[0], pad_token=pad[1], length=length)
    return json.dumps(json.loads(tokenizer.to_str()), indent=1, ensure_ascii=False) + "\n"


def sentencepiece_json(tokenizer: Any) -> str:
    """A sentencepiece-backed transformers tokenizer (SigLIP's) as a `tokenizers` file: the
    sentencepiece model converted (byte fallback kept), its text canonicalisation (lower case,
    punctuation removed, whitespace collapsed) as normalisers ahead of the model's own, and the
    end token appended."""
    import string

    from tokenizers import Regex, normalizers, processors
    from transformers.convert_slow_tokenizer import SpmConverter

    class _Converter(SpmConverter):
        handle_byte_fallback = True

        def post_processor(self) -> Any:
            eos = (str(tokenizer.eos_token), int(tokenizer.eos_token_id))
            return processors.TemplateProcessing(single=f"$A {eos[0]}", special_tokens=[eos])

    converted = _Converter(tokenizer).converted()
    canonical: list[Any] = []
    if getattr(tokenizer, "do_lower_case", False):
        canonical.append(normalizers.Lowercase())
    punctuation = "[" + "".join("\\" + c for c in string.punctuation) + "]"
    canonical += [
        normalizers.Replace(Regex(punctuation), ""),
        normalizers.Replace(Regex(r"\s+"), " "),
        normalizers.Strip(),
    ]
    own = [converted.normalizer] if converted.normalizer is not None else []
    converted.normalizer = normalizers.Sequence([*canonical, *own])
    return str(converted.to_str())


def clip_bpe_json(encoder: dict[str, int], merges: list[tuple[str, str]], pattern: str) -> str:
    """open_clip's bundled byte-level BPE (SimpleTokenizer) as a `tokenizers` file: NFC, collapsed
    whitespace and lower case, its word pattern, end-of-word `</w>`, start and end tokens."""
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE

    start, end = "<start_of_text>", "<end_of_text>"
    model = BPE(
        vocab=encoder,
        merges=merges,
        continuing_subword_prefix="",
        end_of_word_suffix="</w>",
        fuse_unk=False,
    )
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    words = pattern.replace(f"{start}|{end}|", "")  # the special tokens match as added tokens
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(words), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{start} $A {end}", special_tokens=[(start, encoder[start]), (end, encoder[end])]
    )
    tokenizer.add_special_tokens([start, end])
    return str(tokenizer.to_str())
