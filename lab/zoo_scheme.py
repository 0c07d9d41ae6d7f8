"""The `zoo:` scheme: `zoo:NAME` is a member of ptc's offline zoo (`ptc zoo build`), loaded
through its own family's scheme from the checkpoint the zoo saved in that library's native
format, so a zoo model runs through the same code as a real checkpoint.

The zoo is the folder in $PTC_ZOO, else the one committed at the repository's root (zoo/);
zoos one level below it (zoo/audio/, the CLAP members) are searched too.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ptc import targets
from ptc.errors import ModelError, ModelNotFound

REPOSITORY_ZOO = Path(__file__).resolve().parent.parent / "zoo"
INDEX = "zoo.json"


def zoo_root() -> Path:
    return Path(os.environ.get("PTC_ZOO") or REPOSITORY_ZOO).expanduser().resolve()


def _indexes(root: Path) -> list[Path]:
    """The zoo's index and those of the zoos beside it (one level down: zoo/audio/ for CLAP)."""
    return [p for p in [root / INDEX, *sorted(root.glob(f"*/{INDEX}"))] if p.is_file()]


def _member_ref(name: str) -> tuple[str, Path]:
    """(the member's native reference, relative to its zoo's root; that root)."""
    root = zoo_root()
    indexes = _indexes(root)
    if not indexes:
        raise ModelNotFound(
            f"zoo:{name}: no zoo at {root} (looked for {root / INDEX} and {root / '*' / INDEX})",
            "build one with `ptc zoo build`, or point PTC_ZOO at a zoo folder",
        )
    known = []
    for index in indexes:
        try:
            members = json.loads(index.read_text()).get("members", {})
        except (OSError, json.JSONDecodeError) as exc:
            raise ModelError(f"zoo:{name}: cannot read {index}: {exc}") from None
        if name in members:
            return members[name]["ref"], index.parent
        known += members
    raise ModelNotFound(
        f"zoo:{name}: not a member of the zoo at {root}",
        f"members: {', '.join(sorted(known)) or '(none built yet)'}",
    )


def load(name: str, base_dir: Path):
    ref, root = _member_ref(name)
    encoder = targets.load(ref, root)
    encoder.ref = f"zoo:{name}"
    return encoder


def check(name: str, base_dir: Path) -> str:
    ref, root = _member_ref(name)
    return targets.check(ref, root)


def register() -> None:
    """The lab's plugin for ptc.targets (entry point): the `zoo:` scheme, and the lab's small
    timm towers, registered before open_clip builds a model (the zoo's EVA member names one)."""
    from ptc.lab.tiny.openclip import register_timm_towers
    from ptc.targets.openclip import add_tower_hook

    targets.register_scheme("zoo", load, check)
    add_tower_hook(register_timm_towers)
