"""The `hf:` scheme: a local checkpoint folder or a model id already in the local Hugging
Face cache. Never the network; never a pickle (`use_safetensors=True`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from compiler.errors import ModelError, ModelNotFound

from . import HF_MODEL_TYPES, register_scheme

# Loading must never reach a hub: set before transformers / huggingface_hub read them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PICKLE_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def _cache_dir_for(model_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    if model_id.count("/") > 1 or model_id.startswith(("/", ".")):
        return None
    found = try_to_load_from_cache(model_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def resolve_dir(rest: str, base_dir: Path) -> Path:
    """The local folder an `hf:` reference names, or ModelNotFound saying where it looked."""
    local = (base_dir / Path(rest).expanduser()).resolve()
    if local.is_dir():
        folder = local
    else:
        cached = _cache_dir_for(rest)
        if cached is None:
            from huggingface_hub.constants import HF_HUB_CACHE
            raise ModelNotFound(
                f"hf:{rest}: no such model folder (looked at {local}) and not in the local "
                f"Hugging Face cache (looked in {HF_HUB_CACHE})",
                "ptc never downloads; fetch the checkpoint on a machine with network and copy it here")
        folder = cached
    if not (folder / "config.json").is_file():
        raise ModelNotFound(f"hf:{rest}: {folder} has no config.json", "point hf: at a save_pretrained folder")
    if not any(folder.glob("*.safetensors")):
        pickled = [name for name in PICKLE_WEIGHTS if (folder / name).exists()]
        if pickled:
            raise ModelError(f"hf:{rest}: {folder} holds only pickle weights ({pickled[0]}); ptc never "
                             "unpickles checkpoint files", "convert it to safetensors on a trusted machine")
        raise ModelNotFound(f"hf:{rest}: {folder} has no *.safetensors weights")
    return folder


def _family_for(folder: Path, rest: str):
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"hf:{rest}: cannot read {folder / 'config.json'}: {exc}") from None
    if model_type not in HF_MODEL_TYPES:
        raise ModelError(f"hf:{rest}: model_type {model_type!r} is not a supported family",
                         f"supported model types: {', '.join(sorted(HF_MODEL_TYPES))}")
    return HF_MODEL_TYPES[model_type]


def load(rest: str, base_dir: Path):
    folder = resolve_dir(rest, base_dir)
    return _family_for(folder, rest)(folder, ref=f"hf:{rest}")


def check(rest: str, base_dir: Path) -> str:
    folder = resolve_dir(rest, base_dir)
    _family_for(folder, rest)
    return str(folder)


register_scheme("hf", load, check)
