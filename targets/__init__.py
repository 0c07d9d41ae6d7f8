"""Model references and the registry of model families.

A reference is `scheme:rest`, parsed in one place (`load`). Schemes resolve a reference to a
loader; the `hf` scheme then dispatches on the checkpoint's `model_type` through a table
that families fill by registering themselves. The compiler imports only this module's
functions and the `DualEncoder` protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from compiler.errors import ModelNotFound

from .base import DualEncoder, OnnxTower  # noqa: F401  (the protocol the compiler sees)

SchemeLoader = Callable[[str, Path], DualEncoder]
SchemeChecker = Callable[[str, Path], str]

SCHEMES: dict[str, tuple[SchemeLoader, SchemeChecker]] = {}
HF_MODEL_TYPES: dict[str, Callable[..., DualEncoder]] = {}


def register_scheme(name: str, loader: SchemeLoader, checker: SchemeChecker) -> None:
    SCHEMES[name] = (loader, checker)


def register_hf_family(model_types: list[str], loader: Callable[..., DualEncoder]) -> None:
    for model_type in model_types:
        HF_MODEL_TYPES[model_type] = loader


def split_ref(ref: str) -> tuple[str, str]:
    scheme, sep, rest = ref.partition(":")
    if not sep or scheme not in SCHEMES or not rest:
        hint = f"known schemes: {', '.join(f'{s}:' for s in sorted(SCHEMES))}"
        if not sep and Path(ref).exists():
            hint = f"a local checkpoint folder is written hf:{ref}"
        raise ModelNotFound(f"model reference {ref!r} has no known scheme", hint)
    return scheme, rest


def check(ref: str, base_dir: Path = Path(".")) -> str:
    """Resolve a reference without loading weights; return where it resolves to."""
    scheme, rest = split_ref(ref)
    return SCHEMES[scheme][1](rest, Path(base_dir))


def load(ref: str, base_dir: Path = Path(".")) -> DualEncoder:
    """Load a model from a local path or cache; relative paths are relative to `base_dir`."""
    scheme, rest = split_ref(ref)
    return SCHEMES[scheme][0](rest, Path(base_dir))


def _register_builtin() -> None:
    from . import hf, hf_clap, hf_clip, hf_siglip, openclip, zoo  # noqa: F401  (each registers itself on import)


_register_builtin()
