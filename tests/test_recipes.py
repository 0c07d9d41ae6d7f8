"""The committed recipes run on the committed zoo as a fresh checkout has them: each checks,
builds verified, and prints held-out accuracy before and after; the README's demo also
exports and its report agrees with what it printed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from huggingface_hub import ModelCard

from conftest import REPO, run_ptc

# The worked example (example.yaml) builds with the bank its script makes: tests/test_readme.py runs it.
ZOO_RECIPES = sorted(
    p for p in (REPO / "recipes").glob("*.yaml") if p.name not in ("ptc-demo.yaml", "example.yaml")
)
ZOO_INDEXES = (REPO / "zoo" / "zoo.json", REPO / "zoo" / "audio" / "zoo.json")


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """The recipes beside a copy of the committed zoo, laid out as a fresh checkout has them (so
    builds cache their factors there, not in the checkout): without the regenerable splits, and
    without the audio zoo's clips, which `ptc zoo build --profile audio` writes again as the
    CLAP recipe says."""
    root = tmp_path_factory.mktemp("checkout")
    # What .gitignore keeps out of a checkout: regenerable splits and the bank's caches (a local
    # checkout's grid embeddings would spare these builds work that CI's must do).
    shutil.copytree(
        REPO / "zoo",
        root / "zoo",
        ignore=shutil.ignore_patterns(
            "pretrain",
            "train",
            "test-extra",
            "factors",
            "operators",
            "checks",
            "embeddings",
            "exports",
            ".locks",
        ),
    )
    for split in ("probes", "test"):
        for folder in (root / "zoo" / "audio" / "world" / "tasks").glob(f"*/{split}"):
            shutil.rmtree(folder)
    (root / "recipes").mkdir()
    for recipe in ZOO_RECIPES:
        shutil.copy(recipe, root / "recipes" / recipe.name)
    result = run_ptc("zoo", "build", "--profile", "audio", "--root", root / "zoo" / "audio")
    assert result.returncode == 0, result.stderr
    return root


def _env(checkout):
    return {"PTC_ZOO": str(checkout / "zoo")}


def test_the_zoo_is_committed_with_every_member_the_recipes_name():
    members = {name for index in ZOO_INDEXES for name in json.loads(index.read_text())["members"]}
    for recipe in ZOO_RECIPES:
        target = yaml.safe_load(recipe.read_text())[
            "target"
        ]  # zoo:NAME, or a member's folder by path
        name = (
            target.removeprefix("zoo:")
            if target.startswith("zoo:")
            else Path(target.split(":", 1)[1]).name
        )
        assert name in members, recipe.name


@pytest.mark.parametrize(
    "recipe", [p for p in ZOO_RECIPES if p.stem != "demo"], ids=lambda p: p.stem
)
def test_a_committed_recipe_builds_verified_on_the_committed_zoo(recipe, checkout):
    recipe = checkout / "recipes" / recipe.name
    assert run_ptc("check", recipe, env=_env(checkout)).returncode == 0
    result = run_ptc("build", recipe, "--no-export", env=_env(checkout))
    assert result.returncode == 0, result.stderr
    for task in yaml.safe_load(recipe.read_text())["evaluate"]:
        assert f"held-out zero-shot {task}" in result.stdout
    assert "verified (--no-export: nothing written)" in result.stdout


def test_the_readme_demo_exports_and_reports_what_it_printed(tmp_path, checkout):
    # In a fresh interpreter, as the README runs it (most tests call the CLI in-process).
    result = run_ptc(
        "build",
        checkout / "recipes" / "demo.yaml",
        "--out",
        tmp_path / "out",
        env=_env(checkout),
        in_process=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verify"]["linearity"]["max_rel_diff_fp64"] <= 1e-12
    assert set(report["evaluation"]) == {"colour", "count", "background"}
    assert report["evaluation"]["background"]["role"] == "held out"
    for task, figures in report["evaluation"].items():
        assert (
            f"held-out zero-shot {task:<12} {figures['before']:.3f} -> {figures['after']:.3f}"
            in result.stdout
        )
    # The card's model-index holds the same figures, and its picture is there.
    card = ModelCard.load(tmp_path / "out" / "README.md")
    results = {(r.dataset_name, r.metric_name): r.metric_value for r in card.data.eval_results}
    for task, figures in report["evaluation"].items():
        assert results[(task, f"top-1 accuracy after the edit ({figures['role']})")] == round(
            figures["after"], 6
        )
        assert results[(task, f"top-1 accuracy zero-shot ({figures['role']})")] == round(
            figures["before"], 6
        )
    assert card.data.base_model is None  # the zoo's member is a local folder, not a Hub model
    assert "![held-out accuracy](evaluation.png)" in card.text
    assert (tmp_path / "out" / "evaluation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
