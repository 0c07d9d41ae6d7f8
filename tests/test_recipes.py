"""The committed recipes run on the committed zoo as a fresh checkout has them: each checks,
builds verified, and prints held-out accuracy before and after; the README's demo also
exports and its report agrees with what it printed."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from conftest import REPO, run_ptc

ZOO_RECIPES = sorted(p for p in (REPO / "recipes").glob("*.yaml") if p.name != "ptc-demo.yaml")


@pytest.fixture(scope="module")
def zoo_bank(tmp_path_factory):
    """A copy of the committed zoo, so builds cache their factors there, not in the checkout."""
    copy = tmp_path_factory.mktemp("zoo") / "zoo"
    shutil.copytree(REPO / "zoo", copy, ignore=shutil.ignore_patterns("pretrain", "train", "factors", "operators"))
    return copy / "bank"


def _env(bank):
    return {"PTC_ZOO": str(bank.parent)}


def test_the_zoo_is_committed_with_every_member_the_recipes_name():
    members = json.loads((REPO / "zoo" / "zoo.json").read_text())["members"]
    for recipe in ZOO_RECIPES:
        target = yaml.safe_load(recipe.read_text())["target"]
        assert target.removeprefix("zoo:") in members, recipe.name


@pytest.mark.parametrize("recipe", [p for p in ZOO_RECIPES if p.stem != "demo"], ids=lambda p: p.stem)
def test_a_committed_recipe_builds_verified_on_the_committed_zoo(recipe, zoo_bank):
    assert run_ptc("check", recipe, "--bank", zoo_bank, env=_env(zoo_bank)).returncode == 0
    result = run_ptc("build", recipe, "--no-export", "--bank", zoo_bank, env=_env(zoo_bank))
    assert result.returncode == 0, result.stderr
    for task in yaml.safe_load(recipe.read_text())["evaluate"]:
        assert f"held-out zero-shot {task}" in result.stdout
    assert "verified (--no-export: nothing written)" in result.stdout


def test_the_readme_demo_exports_and_reports_what_it_printed(tmp_path, zoo_bank):
    # In a fresh interpreter, as the README runs it (most tests call the CLI in-process).
    result = run_ptc("build", REPO / "recipes" / "demo.yaml", "--out", tmp_path / "out", "--bank", zoo_bank,
                     env=_env(zoo_bank), in_process=False)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verify"]["linearity"]["max_rel_diff_fp64"] <= 1e-12
    assert set(report["evaluation"]) == {"colour", "count", "background"}
    assert report["evaluation"]["background"]["role"] == "held out"
    for task, figures in report["evaluation"].items():
        assert f"held-out zero-shot {task:<12} {figures['before']:.3f} -> {figures['after']:.3f}" in result.stdout
