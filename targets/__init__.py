"""Model references and the registry of model families.

A reference is `scheme:rest`, parsed in one place (`load`). Schemes resolve a reference to a
loader; the `hf` scheme then dispatches on the checkpoint's `model_type` through a table
that families fill by registering themselves. The compiler imports only this module's
functions and the `DualEncoder` protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ptc.errors import ModelNotFound
from ptc.targets.base import DualEncoder, Exportable, Family, OnnxTower, Trainable  # noqa: F401  (what the compiler sees)

SchemeLoader = Callable[[str, Path], Family]
SchemeChecker = Callable[[str, Path], str]
PLUGIN_GROUP = "ptc.targets"  # entry points: a callable that registers schemes (the lab's zoo:)

SCHEMES: dict[str, tuple[SchemeLoader, SchemeChecker]] = {}
HF_MODEL_TYPES: dict[str, Callable[..., Family]] = {}
_plugins_loaded = False


def register_scheme(name: str, loader: SchemeLoader, checker: SchemeChecker) -> None:
    """Add a reference scheme (`name:rest`); a name already taken is refused, never replaced."""
    if name in SCHEMES:
        raise ValueError(f"model scheme {name!r} is already registered")
    SCHEMES[name] = (loader, checker)


def register_hf_family(model_types: list[str], loader: Callable[..., Family]) -> None:
    """Add a transformers family by its config's model_type; a type already taken is refused."""
    taken = [t for t in model_types if t in HF_MODEL_TYPES]
    if taken:
        raise ValueError(f"transformers model_type {taken[0]!r} is already registered")
    for model_type in model_types:
        HF_MODEL_TYPES[model_type] = loader


def schemes() -> list[str]:
    _load_plugins()
    return sorted(SCHEMES)


def hf_model_types() -> list[str]:
    return sorted(HF_MODEL_TYPES)


def _load_plugins() -> None:
    """Schemes that installed plugins add (entry points of PLUGIN_GROUP), once, at first use:
    importing ptc.targets itself imports no plugin."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    from importlib.metadata import entry_points

    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            register = entry.load()
        except ImportError:  # a plugin whose own dependencies are not installed adds nothing
            continue
        register()


def _folder_hint(ref: str) -> str:
    """The scheme that fits what a bare folder holds."""
    folder = Path(ref)
    if (folder / "open_clip_config.json").is_file():
        return f"an open_clip folder is written open_clip:local-dir:{ref}"
    return f"a local checkpoint folder is written hf:{ref}"


def split_ref(ref: str) -> tuple[str, str]:
    _load_plugins()
    scheme, sep, rest = ref.partition(":")
    if not sep or scheme not in SCHEMES or not rest:
        hint = f"known schemes: {', '.join(f'{s}:' for s in sorted(SCHEMES))}"
        if not sep and Path(ref).exists():
            hint = _folder_hint(ref)
        raise ModelNotFound(f"model reference {ref!r} has no known scheme", hint)
    return scheme, rest


def check(ref: str, base_dir: Path = Path(".")) -> str:
    """Resolve a reference without loading weights; return where it resolves to."""
    scheme, rest = split_ref(ref)
    return SCHEMES[scheme][1](rest, Path(base_dir))


def load(ref: str, base_dir: Path = Path(".")) -> Family:
    """Load a model from a local path or cache; relative paths are relative to `base_dir`."""
    scheme, rest = split_ref(ref)
    return SCHEMES[scheme][0](rest, Path(base_dir))


def _register_builtin() -> None:
    """Import every module of this package: each family module registers itself (a new family
    is a new file here, nothing else to edit)."""
    from importlib import import_module
    from pkgutil import iter_modules

    for module in iter_modules(__path__):
        import_module(f"{__name__}.{module.name}")


_register_builtin()
