"""How to run (as opposed to what to build, which is the recipe)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .bank import Bank, default_bank_dir


@dataclass(frozen=True)
class Options:
    bank: Path | None = None     # --bank; wins over the recipe's `bank:`, then PTC_BANK
    out: Path | None = None      # --out; wins over the recipe's export.out
    force: bool = False          # replace a non-empty output directory
    batch_size: int = 64         # probes per forward pass
    progress: bool = True        # progress bars on stderr (tqdm hides them off a terminal)
    export: bool = True          # False: solve, fold and verify in torch, write nothing
    locked: bool = False         # --locked: refuse inputs that differ from RECIPE.lock; never update it

    def open_bank(self, recipe_bank: Path | None = None) -> Bank:
        return Bank(self.bank or recipe_bank or default_bank_dir())
