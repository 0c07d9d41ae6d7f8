"""How to run (as opposed to what to build, which is the recipe).

Each option is defined once, here: its default, and in `metadata` the command-line flag that
sets it and its help. compiler/cli/main.py generates every command's flags from these fields, so the
same option is the same flag, with the same help, wherever a command takes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ptc.compiler.bank.store import Bank, default_bank_dir

if TYPE_CHECKING:  # torch: not imported by commands that only read the bank
    from ptc.devices import Compute


def _flag(flag: str, kind: str, help: str, choices: tuple[str, ...] = ()) -> dict[str, Any]:
    """kind: "path", "count" (an integer >= 1), "text", "choice" (one of `choices`), "switch" (on
    when given), "negated" (off when given)."""
    return {"flag": flag, "kind": kind, "help": help, "choices": choices}


@dataclass(frozen=True)
class Options:
    bank: Path | None = field(
        default=None,
        metadata=_flag(
            "--bank",
            "path",
            "Bank folder (default: the recipe's `bank:` where there is a recipe, else $PTC_BANK, "
            "else ~/.cache/ptc/bank).",
        ),
    )
    out: Path | None = field(
        default=None,
        metadata=_flag(
            "--out",
            "path",
            "Where the command writes its output (for a recipe, this overrides its export.out).",
        ),
    )
    force: bool = field(
        default=False,
        metadata=_flag(
            "--force",
            "switch",
            "Replace an output folder that ptc wrote (never one holding anything else).",
        ),
    )
    batch_size: int = field(
        default=64, metadata=_flag("--batch-size", "count", "Inputs per forward pass.")
    )
    export: bool = field(
        default=True,
        metadata=_flag("--no-export", "negated", "Solve, fold and verify in torch; write nothing."),
    )
    locked: bool = field(
        default=False,
        metadata=_flag(
            "--locked",
            "switch",
            "Refuse (exit 2) when any input differs from RECIPE's lock (RECIPE.lock); "
            "never update it.",
        ),
    )
    device: str = field(
        default="auto",
        metadata=_flag(
            "--device",
            "text",
            "Where forward passes run: auto (a GPU when there is one), cpu, cuda or cuda:N. "
            "Verification and export run on the CPU.",
        ),
    )
    precision: str = field(
        default="fp32",
        metadata=_flag(
            "--precision",
            "choice",
            "Precision of embedding passes; bf16 and fp16 entries are cached apart from fp32.",
            ("fp32", "bf16", "fp16"),
        ),
    )
    progress: bool = True  # progress bars on stderr (tqdm hides them off a terminal); no flag

    def compute(self) -> Compute:
        from ptc.devices import Compute  # torch: not imported by commands that only read the bank

        return Compute(self.device, self.precision)

    def open_bank(self, recipe_bank: Path | None = None) -> Bank:
        return Bank(self.bank or recipe_bank or default_bank_dir())


def option_fields() -> dict[str, Any]:
    """The Options fields that have a flag, by name."""
    return {f.name: f for f in fields(Options) if "flag" in f.metadata}
