"""One grammar for the command line: every flag of every command (the lab's plugged-in ones
included) is the one in the table (compiler/cli/flags.py; the lab's own in lab/cli.py), with the
same help wherever it appears, and docs/cli.md's table lists each."""

from __future__ import annotations

import click
import pytest

from conftest import REPO, run_ptc
from ptc.compiler.cli.flags import flags
from ptc.compiler.cli.main import main
from ptc.lab.cli import LAB_FLAGS

BUILT_IN = {"--help", "--version"}
# Commands that print results, and so print them as JSON on request.
RESULTS = {
    "task list",
    "check",
    "build",
    "verify",
    "diff",
    "certify",
    "eval",
    "bank show",
    "bank prune",
    "zoo show",
}


def _commands(group: click.Group, ctx: click.Context, path: tuple[str, ...] = ()):
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from _commands(command, ctx, (*path, name))
        else:
            yield " ".join((*path, name)), command


def _all():
    ctx = click.Context(main)
    return dict(_commands(main, ctx))


def _long(option: click.Option) -> str:
    return max(option.opts + option.secondary_opts, key=len)


def test_every_flag_of_every_command_is_the_tables_with_its_one_help():
    table = {**flags(), **LAB_FLAGS}
    seen = set()
    for path, command in _all().items():
        for param in command.params:
            if not isinstance(param, click.Option) or _long(param) in BUILT_IN:
                continue
            name = _long(param)
            assert name in table, f"ptc {path}: {name} is in no grammar table"
            assert param.help == table[name], f"ptc {path}: {name}'s help differs from the table's"
            seen.add(name)
    assert not set(LAB_FLAGS) & set(flags())  # the lab never redefines a product flag
    assert seen == set(table)  # and the tables hold nothing no command takes


def test_every_command_takes_the_common_flags_and_results_print_as_json():
    commands = _all()
    assert RESULTS <= set(commands)
    for path, command in commands.items():
        names = {_long(p) for p in command.params if isinstance(p, click.Option)}
        assert {"--debug", "--quiet", "--verbose"} <= names, path
        if path in RESULTS:
            assert "--json" in names, path
    assert run_ptc("bank", "show", "-h").stdout.startswith("Usage: ptc bank show")
    # A model is a --source where a command takes a source model: never --model.
    assert "--source" in {
        _long(p) for p in commands["finetune"].params if isinstance(p, click.Option)
    }


def test_the_cli_page_lists_every_product_flag_with_its_help():
    page = (REPO / "docs" / "cli.md").read_text()
    for name, text in flags().items():
        assert f"| `{name}` | {text} |" in page, name


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_works_before_and_after_the_command(tmp_path, where):
    args = ["task", "add", tmp_path / "missing.yaml", "--bank", tmp_path / "bank"]
    result = run_ptc(*(["--debug", *args] if where == "before" else [*args, "--debug"]))
    assert result.returncode != 0 and "Traceback" in result.stderr
