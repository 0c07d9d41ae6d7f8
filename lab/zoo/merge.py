"""`ptc zoo merge`: take members built in another copy of the zoo (on another machine, or in
parallel with `ptc zoo build --member`) into this one: the model, its sources, their
descriptors and the member's record in zoo.json.

Both zoos must come from the same profile and world, so that descriptors and quality figures
mean the same in each. The member's record leaves this zoo's index first and comes back last:
an interrupted merge leaves the member unbuilt (the next `ptc zoo build` redoes it), never
half old and half new.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from ptc.errors import InputError
from ptc.files import write_bytes_atomic, write_json_atomic
from ptc.output_dirs import staged_directory
from ptc.lab.zoo.build import INDEX, WORLD_FIELDS, built_index

SAME_WORLD = ("profile", *WORLD_FIELDS)  # index fields both zoos must share


def _checked_indexes(root: Path, source: Path, members: tuple[str, ...]) -> tuple[dict, dict]:
    index, other = built_index(root), built_index(source)
    for field in SAME_WORLD:
        if index.get(field) != other.get(field):
            raise InputError(f"{source / INDEX}: {field} is {other.get(field)!r}, this zoo's is {index.get(field)!r}",
                             "merge only from a copy of this zoo built with the same profile")
    for name in members:
        if name not in other.get("members", {}) or not (source / "models" / name).is_dir():
            built = ", ".join(other.get("members", {})) or "none"
            raise InputError(f"{source}: member {name!r} is not built there", f"built members: {built}")
    return index, other


def _descriptors(bank: Path, name: str) -> dict[str, Path]:
    """A member's descriptor files (NAME-sSEED) in a bank, by path relative to the bank; not
    those of another member whose name starts the same way (NAME-small-s0)."""
    own = re.compile(rf"{re.escape(name)}-s\d+")
    return {p.relative_to(bank).as_posix(): p for p in sorted(bank.glob(f"descriptors/*/{name}-s*.safetensors"))
            if own.fullmatch(p.stem)}


def merge_members(root: Path, source: Path, members: tuple[str, ...]) -> list[str]:
    """Replace `members` of the zoo at `root` with those built at `source`; returns their names."""
    root, source = Path(root), Path(source)
    index, other = _checked_indexes(root, source, members)
    for name in members:
        index["members"].pop(name, None)
        write_json_atomic(root / INDEX, index)
        for part in ("models", "sources"):
            if (source / part / name).is_dir():
                with staged_directory(root / part / name, replace=True, unmarked=True) as staging:
                    shutil.copytree(source / part / name, staging, dirs_exist_ok=True)
        incoming = _descriptors(source / "bank", name)
        for rel, path in _descriptors(root / "bank", name).items():
            if rel not in incoming:  # a seed or task the source zoo no longer has
                path.unlink()
        for rel, path in incoming.items():
            write_bytes_atomic(root / "bank" / rel, path.read_bytes())
        index["members"][name] = other["members"][name]
        write_json_atomic(root / INDEX, index)
    return list(members)
