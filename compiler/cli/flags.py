"""The command line's one grammar: every flag any `ptc` command takes, defined once here with
the one help text it has wherever it appears: the run options' flags (`RUN_OPTIONS`, each
setting a field of recipe.options.Options, whose default it shows) and the rest (`ARGUMENTS`).
main.py builds every command's flags from this module, plugins' commands included, and a
test holds every command to it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

# What click's option decorators are: a command's callback in, the same callback out.
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


@dataclass(frozen=True)
class RunFlag:
    """The flag that sets one run option (a field of recipe.options.Options)."""

    flag: str
    # "path", "count" (an integer >= 1), "text", "choice" (one of `choices`), "switch" (on
    # when given), "negated" (off when given)
    kind: str
    help: str
    choices: tuple[str, ...] = ()


# Options field -> its flag; the default is the field's.
RUN_OPTIONS = {
    "bank": RunFlag(
        "--bank",
        "path",
        "Bank folder (default: the recipe's `bank:` where there is a recipe, else $PTC_BANK, "
        "else ~/.cache/ptc/bank).",
    ),
    "out": RunFlag(
        "--out",
        "path",
        "Where the command writes its output (for a recipe, this overrides its export.out).",
    ),
    "force": RunFlag(
        "--force",
        "switch",
        "Replace an output folder that ptc wrote (never one holding anything else).",
    ),
    "batch_size": RunFlag(
        "--batch-size",
        "count",
        "Inputs per batch (on a CPU a large model runs each batch 8 at a time, faster there).",
    ),
    "export": RunFlag("--no-export", "negated", "Solve, fold and verify in torch; write nothing."),
    "locked": RunFlag(
        "--locked",
        "switch",
        "Refuse (exit 2) when any input differs from RECIPE's lock (RECIPE.lock); never update it.",
    ),
    "device": RunFlag(
        "--device",
        "text",
        "Where forward passes run: auto (a GPU when there is one), cpu, cuda or cuda:N. "
        "Verification and export run on the CPU.",
    ),
    "precision": RunFlag(
        "--precision",
        "choice",
        "Precision of embedding passes; bf16 and fp16 entries are cached apart from fp32.",
        ("fp32", "bf16", "fp16"),
    ),
    "embed_runtime": RunFlag(
        "--embed-runtime",
        "choice",
        "What runs the target's embedding passes on a CPU: auto (onnxruntime on its base ONNX "
        "export where the build writes ONNX or the export is cached, the edit acts on the "
        "embeddings, the passes are fp32 and it measured no slower than torch on this machine, "
        "timed once per model and kept in the bank; else torch), torch, or onnxruntime. Cached "
        "apart.",
        ("auto", "torch", "onnxruntime"),
    ),
}

# The other flags: flag -> help. A model is always a reference with its scheme (hf:DIR, hf:org/name,
# open_clip:local-dir:DIR); a fine-tune, an adapter or a build output may be a bare folder.
ARGUMENTS = {
    "--task": "A task, by the name it is registered under in the bank (`ptc task list`).",
    "--source": "The pre-trained source model: a reference with its scheme (hf:DIR, hf:org/name, "
    "open_clip:local-dir:DIR).",
    "--finetuned": "The source's fine-tune: a model reference, a checkpoint folder, or a peft LoRA adapter folder.",
    "--data": "A folder of inputs, read recursively; laid out DIR/<class>/<files> where labels are needed "
    "(eval, finetune).",
    "--id": "The descriptor's id in the bank (default: the source's folder name).",
    "--lock-file": "A lock other than the default: what `ptc lock` writes (default RECIPE.lock), what "
    "`ptc verify` checks against (default OUTPUT/ptc.lock).",
    "--replace": "Re-register a task whose grid changed (bank entries are keyed by grid: none is overwritten).",
    "--json": "Print the result as JSON on stdout.",
    "--runtime": "What runs the model: torch (its checkpoint, the family's code) or onnx (a build "
    "output's graphs and serving contract, with onnxruntime and numpy; torch is never imported).",
    "--ray": "Run forward passes and solves as Ray tasks (a cluster address, or 'local').",
    "--rank": "LoRA rank.",
    "--steps": "Training steps.",
    "--seed": "Random seed of the training.",
    "--lora-dropout": "peft's lora_dropout while training (a regulariser; nothing changes at inference).",
    "--max-size": "Keep the bank's exported graphs within this size (20GB, 500MB; units are powers "
    "of 1000), removing the least recently used first; without it, every one no lock names.",
    "--include-locked": "Let `bank prune` remove an export that a recipe's or an output's lock names "
    "(the next build of that recipe exports it again).",
    "--dry-run": "Say what would be removed; remove nothing.",
    "--debug": "Show tracebacks and library warnings.",
    "--quiet": "No progress on stderr: results and errors only.",
    "--verbose": "More detail: library warnings, and each stage's time after a build.",
}


def flags() -> dict[str, str]:
    """Every flag of the product's commands and its help: the run options' and the arguments'."""
    return {
        **{option.flag: option.help for option in RUN_OPTIONS.values()},
        **ARGUMENTS,
    }


def flag(
    name: str, *declarations: str, table: dict[str, str] | None = None, **settings: Any
) -> Decorator:
    """click.option for `name`, with its help from `table` (a plugin's own flags) or this one;
    `declarations` add a short form or the parameter's name, `settings` what differs by command
    (required, default, type)."""
    return click.option(name, *declarations, help={**flags(), **(table or {})}[name], **settings)
