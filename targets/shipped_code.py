"""Nothing a model folder ships is ever run.

A checkpoint folder can name code for its loader to import (transformers' `auto_map` in any of
its JSON configs, with `trust_remote_code`), carry weights only as pickles (unpickling runs
code), or, in open_clip's config, ask for tower weights from elsewhere (a timm or transformers
`*_pretrained` tower, a transformers text tower read from another folder). Every loading path
calls `refuse_shipped_code` on the folder it reads before any library sees it, and passes
`trust_remote_code=False` on top, so that no library ever prompts on standard input either.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ptc.errors import ModelError

# Keys that make a transformers loader import code named by the folder, or say it may.
CODE_KEYS = ("auto_map", "trust_remote_code")
# Keys of open_clip's model_cfg towers that fetch weights or a model from outside the checkpoint.
FOREIGN_TOWER_KEYS = ("timm_model_pretrained", "hf_model_pretrained", "hf_model_name")
# Weight files that are pickles: loading one runs whatever code it names.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt")
ADAPTER_WEIGHTS, ADAPTER_PICKLE = "adapter_model.safetensors", "adapter_model.bin"
REFUSED_HINT = (
    "ptc never runs code shipped with a model; use a checkpoint of a supported family saved with "
    "save_pretrained (or open_clip's local-dir layout) and safetensors weights"
)


def _code_keys(value: Any, path: str = "") -> list[str]:
    """Dotted paths of every key in CODE_KEYS with a truthy value, anywhere in a JSON value."""
    found = []
    if isinstance(value, dict):
        for key, inner in value.items():
            here = f"{path}.{key}" if path else str(key)
            if key in CODE_KEYS and inner:
                found.append(here)
            found += _code_keys(inner, here)
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _code_keys(inner, f"{path}[{index}]")
    return found


def _read_json(path: Path, ref: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelError(f"{ref}: cannot read {path}: {exc}".split("\n")[0]) from None


def refuse_shipped_code(folder: Path, ref: str) -> None:
    """ModelError, naming the file and key, if any JSON config in `folder` names code to run."""
    for config in sorted(Path(folder).glob("*.json")):
        if not config.is_file():
            continue
        keys = _code_keys(_read_json(config, ref))
        if keys:
            raise ModelError(
                f"{ref}: {config} names custom code ({keys[0]}); refused", REFUSED_HINT
            )


def refuse_foreign_towers(model_cfg: dict[str, Any], where: str, ref: str) -> None:
    """An open_clip model_cfg whose towers load weights or code from outside its checkpoint."""
    for tower in ("vision_cfg", "text_cfg"):
        cfg = model_cfg.get(tower) or {}
        for key in FOREIGN_TOWER_KEYS:
            if cfg.get(key):
                raise ModelError(
                    f"{ref}: {where}: model_cfg.{tower}.{key} loads a tower from outside the "
                    "checkpoint; refused",
                    "ptc loads every weight from the checkpoint file itself",
                )
    keys = _code_keys(model_cfg)
    if keys:
        raise ModelError(
            f"{ref}: {where} names custom code (model_cfg.{keys[0]}); refused", REFUSED_HINT
        )


def refuse_pickle_file(path: Path, ref: str) -> None:
    if Path(path).suffix.lower() in PICKLE_SUFFIXES:
        raise ModelError(
            f"{ref}: {Path(path).name} is a pickle; ptc never unpickles checkpoint files",
            "convert it to safetensors on a trusted machine",
        )


def refuse_unsafe_adapter(adapter_dir: Path, ref: str) -> None:
    """A peft adapter folder: its weights must be safetensors, and its configs name no code.
    (peft's own `auto_mapping` names the base model's class, which ptc never imports by it.)"""
    adapter_dir = Path(adapter_dir)
    if not (adapter_dir / ADAPTER_WEIGHTS).is_file():
        if (adapter_dir / ADAPTER_PICKLE).exists():
            raise ModelError(
                f"{ref}: the adapter {adapter_dir} is saved only as a pickle ({ADAPTER_PICKLE}); "
                "ptc never unpickles checkpoint files",
                "save it with save_pretrained(safe_serialization=True), on a trusted machine",
            )
        raise ModelError(
            f"{ref}: the adapter folder {adapter_dir} has no {ADAPTER_WEIGHTS}",
            "save the adapter with peft's save_pretrained",
        )
    refuse_shipped_code(adapter_dir, ref)
    config = _read_json(adapter_dir / "adapter_config.json", ref)
    # peft imports the module it names
    if isinstance(config, dict) and config.get("megatron_config"):
        raise ModelError(
            f"{ref}: {adapter_dir / 'adapter_config.json'} names a module to import "
            "(megatron_config); refused",
            REFUSED_HINT,
        )
