"""Provenance stamped into a checkpoint's safetensors headers, without loading a tensor."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

from ptc.errors import OutputError
from ptc.files import atomic_file, safetensors_header


def stamp_safetensors(folder: Path, provenance: dict[str, str]) -> None:
    """Add provenance to the `__metadata__` of every safetensors file under `folder`, keeping
    what the library wrote there (transformers needs `format: pt`), the header in sorted order
    (safetensors writes its metadata map in hash order, which changes from process to process,
    and the same build must give the same bytes). Data offsets are relative to the end of the
    header, so only the header is rewritten: the tensor bytes are streamed across, never loaded."""
    for path in sorted(folder.rglob("*.safetensors")):
        with open(path, "rb") as source:
            try:
                header = safetensors_header(source, path.stat().st_size)
            except ValueError as exc:
                raise OutputError(f"{path}: not a safetensors file: {exc}") from None
            metadata = dict(header.get("__metadata__") or {})
            metadata.update(
                {
                    "format": metadata.get("format", "pt"),
                    **{k: str(v) for k, v in provenance.items()},
                }
            )
            header["__metadata__"] = metadata
            encoded = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
            encoded += b" " * (-len(encoded) % 8)  # the format aligns the data to 8 bytes
            with atomic_file(path) as target:
                target.write(struct.pack("<Q", len(encoded)) + encoded)
                shutil.copyfileobj(source, target, 16 << 20)
