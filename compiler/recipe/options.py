"""How to run (as opposed to what to build, which is the recipe): the bank, the output
override, devices and precision, and the other run options with their defaults. The command
line spells each as a flag (compiler/cli/flags.py, `RUN_OPTIONS`); the library takes them here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ptc.compiler.bank.store import Bank, default_bank_dir

if TYPE_CHECKING:  # torch: not imported by commands that only read the bank
    from ptc.devices import Compute


@dataclass(frozen=True)
class Options:
    bank: Path | None = None  # None: the recipe's `bank:`, else $PTC_BANK, else the default
    out: Path | None = None  # None: the recipe's export.out
    force: bool = False  # replace an output folder ptc wrote
    batch_size: int = 64
    export: bool = True  # False: verify in torch, write nothing
    locked: bool = False  # refuse any input that differs from the recipe's lock
    device: str = "auto"
    precision: str = "fp32"
    embed_runtime: str = "auto"  # auto, torch or onnxruntime (compiler/export/onnx_embed.py)
    progress: bool = True  # progress bars on stderr (tqdm hides them off a terminal); no flag

    def compute(self) -> Compute:
        from ptc.devices import Compute  # torch: not imported by commands that only read the bank

        return Compute(self.device, self.precision)

    def open_bank(self, recipe_bank: Path | None = None) -> Bank:
        return Bank(self.bank or recipe_bank or default_bank_dir())
