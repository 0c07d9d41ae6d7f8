"""Content hashes of tensors: the one definition the bank (entry integrity) and the model
families (weight fingerprints) share."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ptc.timers import timed

if TYPE_CHECKING:
    import torch


def tensors_sha256(named: dict[str, torch.Tensor], prefix: str = "") -> str:
    """sha256 of `prefix` and each tensor's name, dtype, shape and raw bytes, sorted by name."""
    import torch  # here, not at import: commands that only read task records need no torch

    with timed("hash_tensors"):
        digest = hashlib.sha256(prefix.encode())
        for name in sorted(named):
            tensor = named[name].detach().contiguous().cpu()
            digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
            # the buffer itself, not a copy (numpy's stubs do not declare the buffer protocol)
            digest.update(tensor.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
        return digest.hexdigest()
