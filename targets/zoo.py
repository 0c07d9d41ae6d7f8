"""The `zoo:` scheme: `zoo:NAME` is a member of ptc's offline zoo (`ptc zoo build`), loaded
through its own family's scheme from the checkpoint the zoo saved in that library's native
format, so a zoo model runs through the same code as a real checkpoint.

The zoo is the folder in $PTC_ZOO, else the one committed at the repository's root (zoo/).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from compiler.errors import ModelError, ModelNotFound

from . import register_scheme

REPOSITORY_ZOO = Path(__file__).resolve().parent.parent / "zoo"
INDEX = "zoo.json"


def zoo_root() -> Path:
    return Path(os.environ.get("PTC_ZOO") or REPOSITORY_ZOO).expanduser().resolve()


def _member_ref(name: str) -> tuple[str, Path]:
    """(the member's native reference, relative to the zoo root; the root)."""
    root = zoo_root()
    index = root / INDEX
    if not index.is_file():
        raise ModelNotFound(f"zoo:{name}: no zoo at {root} (looked for {index})",
                            "build one with `ptc zoo build`, or point PTC_ZOO at a zoo folder")
    try:
        members = json.loads(index.read_text()).get("members", {})
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"zoo:{name}: cannot read {index}: {exc}") from None
    if name not in members:
        raise ModelNotFound(f"zoo:{name}: not a member of the zoo at {root}",
                            f"members: {', '.join(sorted(members)) or '(none built yet)'}")
    return members[name]["ref"], root


def load(name: str, base_dir: Path):
    from . import load as load_ref

    ref, root = _member_ref(name)
    encoder = load_ref(ref, root)
    encoder.ref = f"zoo:{name}"
    return encoder


def check(name: str, base_dir: Path) -> str:
    from . import check as check_ref

    ref, root = _member_ref(name)
    return check_ref(ref, root)


register_scheme("zoo", load, check)
