"""The product and the lab are two houses: the product imports nothing of the lab, installs and
builds from a wheel on its own, and the lab plugs in only through the product's entry points."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, write_recipe

PRODUCT = ("ptc", "compiler", "targets")  # folders of the product (ptc, ptc.compiler, ptc.targets)
LAB = ("lab", "benchmarks")  # folders of the lab (ptc.lab, ptc.lab.benchmarks)


def _python(
    *args: str, env: dict | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
        cwd=cwd or REPO,
    )


def test_importing_the_product_cli_imports_nothing_of_the_lab():
    result = _python("-X", "importtime", "-c", "import ptc.compiler.cli.main")
    assert result.returncode == 0, result.stderr
    imported = [
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line
    ]
    assert "ptc.compiler.cli.main" in imported
    assert [
        name for name in imported if name.startswith("ptc.lab") or name in ("sklearn", "matplotlib")
    ] == []


def _imports(path: Path) -> list[str]:
    """Absolute module names a file imports (relative imports resolved against its package)."""
    package = {"ptc": "ptc", "compiler": "ptc.compiler", "targets": "ptc.targets"}[
        path.relative_to(REPO).parts[0]
    ]
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return names


def test_no_product_module_imports_the_lab_or_the_compiler_from_targets():
    files = _product_files()
    assert len(files) > 30
    lab = {
        str(p.relative_to(REPO)): [
            n for n in _imports(p) if n.startswith(("ptc.lab", "benchmarks"))
        ]
        for p in files
    }
    assert {k: v for k, v in lab.items() if v} == {}
    # targets is below the compiler: it may use ptc's shared errors and hashing, never the compiler
    upward = {
        str(p.relative_to(REPO)): [n for n in _imports(p) if n.startswith("ptc.compiler")]
        for p in (REPO / "targets").rglob("*.py")
    }
    assert {k: v for k, v in upward.items() if v} == {}


def _product_files() -> list[Path]:
    """Every product file once: ptc/'s links to compiler/ and targets/ are walked as folders."""
    core = [p for p in (REPO / "ptc").glob("*.py")]
    return core + [p for folder in PRODUCT[1:] for p in (REPO / folder).rglob("*.py")]


def test_no_function_in_the_product_has_more_than_45_statements():
    """A function fits on one screen. Counted in statements, not lines: the formatter wraps a
    long call over as many lines as it has arguments."""
    long = []
    for path in _product_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                statements = {n.lineno for n in ast.walk(node) if isinstance(n, ast.stmt)}
                if len(statements) > 45:
                    long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}")
    assert long == []


def test_without_the_lab_ptc_shows_the_product_only():
    script = (
        "import ptc.lab.plugin as plugin; plugin.installed = lambda: False\n"
        "from ptc.compiler.cli.main import main; main(['--help'])\n"
    )
    result = _python("-c", script)
    assert result.returncode == 0, result.stderr
    assert "build" in result.stdout and "zoo" not in result.stdout and "paper" not in result.stdout
    with_lab = _python("-m", "ptc.compiler.cli", "--help")
    assert "zoo" in with_lab.stdout and "paper" in with_lab.stdout


def test_the_registries_refuse_a_duplicate_and_list_what_they_hold():
    from ptc import targets

    assert {"hf", "open_clip", "zoo"} <= set(targets.schemes())
    assert {"clip", "siglip", "siglip2", "clap"} <= set(targets.hf_model_types())
    with pytest.raises(ValueError, match="model scheme 'hf' is already registered"):
        targets.register_scheme("hf", lambda rest, base: None, lambda rest, base: "")
    with pytest.raises(ValueError, match="model_type 'clip' is already registered"):
        targets.register_hf_family(["clip"], lambda *a, **k: None)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The product's wheel, built from the repository and installed (without dependencies: this
    environment has them) into a folder of its own."""
    root = tmp_path_factory.mktemp("wheel")
    built = _python(
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(root / "dist"),
        str(REPO),
    )
    assert built.returncode == 0, built.stderr
    (path,) = (root / "dist").glob("ptc-*.whl")
    installed = _python(
        "-m", "pip", "install", "--no-deps", "-q", "--target", str(root / "site"), str(path)
    )
    assert installed.returncode == 0, installed.stderr
    return root / "site"


def test_a_wheel_installs_and_builds_a_recipe_with_local_models(wheel, world, tmp_path):
    recipe = write_recipe(
        tmp_path / "recipe.yaml", world, export={"out": "out", "formats": ["safetensors"]}
    )
    env = {"PYTHONPATH": str(wheel)}
    where = _python(
        "-c",
        "import ptc.compiler.cli.main, ptc.targets; print(ptc.compiler.cli.main.__file__)",
        env=env,
        cwd=tmp_path,
    )
    # the wheel's copy, not the checkout
    assert where.stdout.strip().startswith(str(wheel)), where.stdout
    result = _python("-m", "ptc.compiler.cli", "build", str(recipe), env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verify"]["equivalence"]["reload_max_abs_diff"] <= 1e-5
    names = {p.relative_to(wheel).parts[0] for p in wheel.iterdir()}
    assert "ptc" in names and not names & {
        "compiler",
        "targets",
        "benchmarks",
        "lab",
    }  # one namespace


def _commands(group, prefix="ptc"):
    import click

    for name in group.list_commands(None):
        command = group.get_command(None, name)
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix} {name}")
        else:
            yield f"{prefix} {name}", command


def test_every_product_command_takes_a_run_option_by_the_one_flag_defined_for_it():
    """compiler/cli/flags.py defines each run option's flag once (flag, help); no product command
    spells one of those flags by hand."""
    from ptc.compiler.cli.flags import RUN_OPTIONS
    from ptc.compiler.cli.main import main

    defined = {option.flag: option.help for option in RUN_OPTIONS.values()}
    seen = []
    for path, command in _commands(main):
        if not command.callback.__module__.startswith("ptc.compiler"):
            continue  # the lab's commands keep their own flags
        for param in command.params:
            for flag in set(param.opts) & set(defined):
                assert param.help == defined[flag], (path, flag)
                seen.append((path, flag))
    assert {"ptc build", "ptc task add", "ptc descriptor add", "ptc bank verify"} <= {
        p for p, _ in seen
    }
    assert ("ptc build", "--batch-size") in seen and ("ptc finetune", "--force") in seen


def test_every_run_option_but_progress_has_exactly_one_flag():
    from dataclasses import fields

    from ptc.compiler.cli.flags import RUN_OPTIONS
    from ptc.compiler.recipe.options import Options

    assert set(RUN_OPTIONS) == {f.name for f in fields(Options)} - {"progress"}
    spelled = [option.flag for option in RUN_OPTIONS.values()]
    assert len(spelled) == len(set(spelled))


def test_listing_a_banks_tasks_imports_no_torch(world):
    """`ptc task list` reads JSON records only: importing torch would cost it 2 s and 660 MB."""
    result = _python(
        "-X", "importtime", "-m", "ptc.compiler.cli", "task", "list", "--bank", str(world.bank)
    )
    assert result.returncode == 0 and "colour" in result.stdout, result.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines() if "|" in line
    }
    assert "torch" not in imported and "ptc.compiler.bank.store" in imported
