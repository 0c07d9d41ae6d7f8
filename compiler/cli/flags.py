"""The command line's one grammar: every flag any `ptc` command takes, with the one help text
it has wherever it appears. The run options (--bank, --out, --device, ...) are defined with
their defaults in options.py and read from there; the rest are here. cli.py builds every flag
from this table (`flag`), plugins' commands included, and a test holds every command to it, so
the same thing is the same flag, said the same way, in every command."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from ptc.compiler.recipe.options import option_fields

# What click's option decorators are: a command's callback in, the same callback out.
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]

# flag -> help. A model is always a reference with its scheme (hf:DIR, hf:org/name,
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
    "--ray": "Run forward passes and solves as Ray tasks (a cluster address, or 'local').",
    "--rank": "LoRA rank.",
    "--steps": "Training steps.",
    "--seed": "Random seed of the training.",
    "--lora-dropout": "peft's lora_dropout while training (a regulariser; nothing changes at inference).",
    "--debug": "Show tracebacks and library warnings.",
    "--quiet": "No progress on stderr: results and errors only.",
    "--verbose": "More detail: library warnings, and each stage's time after a build.",
}


def flags() -> dict[str, str]:
    """Every flag of the product's commands and its help: the run options' and the arguments'."""
    return {
        **{f.metadata["flag"]: f.metadata["help"] for f in option_fields().values()},
        **ARGUMENTS,
    }


def flag(
    name: str, *declarations: str, table: dict[str, str] | None = None, **settings: Any
) -> Decorator:
    """click.option for `name`, with its help from `table` (a plugin's own flags) or this one;
    `declarations` add a short form or the parameter's name, `settings` what differs by command
    (required, default, type)."""
    return click.option(name, *declarations, help={**flags(), **(table or {})}[name], **settings)
