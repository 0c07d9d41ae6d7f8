"""The serving contract: `onnx/serving.json` and `onnx/tokenizer.json`, what an ONNX-only
client needs besides the graphs.

    {"format": "ptc-serving/1",
     "input": {"graph": "vision_model.onnx", "output": "image_embeds",
               "preprocessing": {"kind": "image" | "naflex" | "audio", ...}},
     "text":  {"graph": "text_model.onnx", "output": "text_embeds", "inputs": ["input_ids", ...],
               "tokenizer": "tokenizer.json", "context_length": 77,
               "padding": "longest" | "max_length", "padding_side": "right" | "left",
               "truncation_side": "right" | "left", "pad_id": 0},
     "similarity": "cosine"}

Both graphs return unnormalised embeddings: L2-normalise each before comparing (cosine), as
zero-shot classification does. docs/serving.md describes every preprocessing field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict, cast

from ptc.errors import InputError

FORMAT = "ptc-serving/1"
CONTRACT_FILE = "serving.json"
TOKENIZER_FILE = "tokenizer.json"
KINDS = ("image", "naflex", "audio")


class InputSide(TypedDict):
    graph: str
    output: str
    preprocessing: dict[str, Any]


class TextSide(TypedDict):
    graph: str
    output: str
    inputs: list[str]
    tokenizer: str
    context_length: int
    padding: str
    padding_side: str
    truncation_side: str
    pad_id: int


class Contract(TypedDict):
    format: str
    input: InputSide
    text: TextSide
    similarity: str


def contract_document(input_side: InputSide, text_side: TextSide) -> Contract:
    return {"format": FORMAT, "input": input_side, "text": text_side, "similarity": "cosine"}


def contract_bytes(contract: Contract) -> bytes:
    return (json.dumps(contract, indent=2, sort_keys=True) + "\n").encode("utf-8")


def contract_folder(folder: Path) -> Path:
    """Where the contract and the graphs lie: an output's `onnx/`, or the folder given."""
    folder = Path(folder)
    return folder / "onnx" if (folder / "onnx" / CONTRACT_FILE).is_file() else folder


def read_contract(folder: Path) -> Contract:
    """The contract in an output's `onnx/` folder (or the output folder itself), checked for
    what a client reads: one clear InputError naming the file and field otherwise."""
    folder = contract_folder(folder)
    path = folder / CONTRACT_FILE
    if not path.is_file():
        raise InputError(
            f"{folder}: no {CONTRACT_FILE} (looked at {path})",
            "give a build output folder (or its onnx/) built with export.formats including onnx",
        )
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: cannot read the serving contract: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        found = document.get("format") if isinstance(document, dict) else type(document).__name__
        raise InputError(
            f"{path}: format: expected {FORMAT!r}, found {found!r}",
            "rebuild the output with this version of ptc",
        )
    for side, fields in (("input", InputSide.__annotations__), ("text", TextSide.__annotations__)):
        record = document.get(side)
        missing = [f for f in fields if not isinstance(record, dict) or f not in record]
        if missing:
            raise InputError(f"{path}: {side}: missing {', '.join(missing)}", "rebuild the output")
    kind = document["input"]["preprocessing"].get("kind")
    if kind not in KINDS:
        raise InputError(
            f"{path}: input.preprocessing.kind: expected one of {', '.join(KINDS)}, found {kind!r}",
            "rebuild the output with this version of ptc",
        )
    for side in ("input", "text"):
        graph = folder / document[side]["graph"]
        if not graph.is_file():
            raise InputError(
                f"{path}: {side}.graph: {graph} does not exist", "copy the whole onnx/ folder"
            )
    return cast(Contract, document)  # checked above, field by field


def describe(contract: Contract) -> list[str]:
    """The contract in words, one line per step, for a model card: what a client must do to a
    file and to a prompt before the graphs see them."""
    pre, text = contract["input"]["preprocessing"], contract["text"]
    if pre["kind"] == "audio":
        steps = [
            f"read mono at {pre['sampling_rate']} Hz; keep the first {pre['max_samples']} samples; "
            f"a shorter clip is repeated whole, then zero-padded to {pre['max_samples']} "
            f"(`{pre['padding']}`)",
            f"log-mel spectrogram: {pre['n_fft']}-point STFT every {pre['hop_length']} samples "
            f"(centred, reflect padding, periodic Hann window), power {pre['power']:g}, "
            f"{pre['n_mels']} {pre['mel_scale']}-scale mel filters ({pre['mel_norm']} "
            f"normalisation) from {pre['f_min']:g} to {pre['f_max']:g} Hz, floor "
            f"{pre['mel_floor']:g}, in dB",
            f"`{pre['input']}`: float32, {pre['layout']}",
        ]
    else:
        steps = [_image_resize(pre)]
        crop = pre.get("center_crop")
        if crop:
            offset = "rounded down" if crop["offset"] == "floor" else "rounded half to even"
            steps.append(
                f"centre-crop to {crop['height']}x{crop['width']} (offset {offset}; a smaller "
                f"image padded with {crop.get('fill', 0)} first)"
            )
        steps.append(
            f"scale by {pre['rescale']:.8g}, subtract mean {_triple(pre['mean'])}, divide by "
            f"std {_triple(pre['std'])} (RGB)"
        )
        if pre["kind"] == "naflex":
            steps.append(
                f"cut into {pre['patch_size']}x{pre['patch_size']} patches (row-major, each "
                f"flattened rows x columns x channels), zero-pad to {pre['max_num_patches']} "
                f"patches: `{pre['input']}` float32, `{pre['mask_input']}` int32 (1 = real "
                f"patch), `{pre['shapes_input']}` int64 (the patch grid, rows and columns)"
            )
        else:
            steps.append(f"`{pre['input']}`: float32, {pre['layout']}")
    pad = "to the context" if text["padding"] == "max_length" else "to the longest prompt"
    steps.append(
        f"prompts: `{text['tokenizer']}` (truncates at {text['context_length']} tokens from the "
        f"{text['truncation_side']}, pads {pad} on the {text['padding_side']} with id "
        f"{text['pad_id']}); the text graph takes {', '.join(f'`{n}`' for n in text['inputs'])}"
    )
    steps.append("both graphs return unnormalised embeddings: L2-normalise them, compare by cosine")
    return steps


def _image_resize(pre: dict[str, Any]) -> str:
    resize, how = pre.get("resize"), pre["interpolation"]
    if pre["kind"] == "naflex":
        return (
            f"resize ({how}, aspect kept) to the largest grid of whole {pre['patch_size']}-pixel "
            f"patches holding at most {pre['max_num_patches']} patches"
        )
    if not resize:
        return "no resize: images must already be the model's size"
    if "shortest_edge" in resize:
        return f"resize ({how}) so the shorter side is {resize['shortest_edge']} pixels"
    if "keep_ratio" in resize:
        rule = resize["keep_ratio"]
        return (
            f"resize ({how}, aspect kept, sides rounded half to even) so the {rule['fit']} side "
            f"fits {rule['height']}x{rule['width']}"
        )
    return f"resize ({how}) to {resize['height']}x{resize['width']}, aspect not kept"


def _triple(values: list[float]) -> str:
    return "(" + ", ".join(f"{v:.8g}" for v in values) + ")"
