"""Recipes in version control: bit-reproducible builds, RECIPE.lock, --locked, verify and diff."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from conftest import REPO, run_ptc, tree_digest, write_recipe
from ptc.compiler.bank.store import Bank

# Bookkeeping, not outputs: this run's timings and cache counts, and the ownership record that
# hashes them.
RUN_FILES = {"run.json", ".ptc-output.json"}


def _every_format(path: Path, world, bank: Path, out: Path, **overrides) -> Path:
    return write_recipe(
        path,
        world,
        bank=str(bank),
        export={
            "out": str(out),
            "formats": ["onnx", "safetensors", "triton"],
            "precision": ["fp32", "fp16"],
        },
        **overrides,
    )


def test_two_builds_in_two_processes_give_the_same_bytes_in_every_file(world, tmp_path):
    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    digests = []
    for name in ("a", "b"):  # the first fills the bank's caches, the second reads them
        (tmp_path / name).mkdir()
        # the same bytes
        recipe = _every_format(tmp_path / name / "recipe.yaml", world, bank, Path("out"))
        result = run_ptc("build", recipe, in_process=False)
        assert result.returncode == 0, result.stderr
        digests.append(
            {k: v for k, v in tree_digest(tmp_path / name / "out").items() if k not in RUN_FILES}
        )
    assert {
        "model/model.safetensors",
        "model/tokenizer.json",
        "onnx/vision_model_fp16.onnx",
        "triton/text_model/config.pbtxt",
        "report.json",
        "README.md",
        "ptc.lock",
    } <= set(digests[0])
    for path in (tmp_path / "a" / "out").rglob("*"):  # no output names the checkout that built it
        if path.is_file() and path.name not in RUN_FILES:
            assert str(REPO).encode() not in path.read_bytes(), path.name
    different = sorted(k for k in digests[0] if digests[0][k] != digests[1].get(k))
    assert different == [] and digests[0].keys() == digests[1].keys()
    locks = [json.loads((tmp_path / n / "recipe.lock").read_text()) for n in ("a", "b")]
    assert locks[0] == locks[1] == json.loads((tmp_path / "a" / "out" / "ptc.lock").read_text())


@pytest.fixture()
def locked(world, tmp_path):
    """A recipe on a private bank and target, locked with `ptc lock` (nothing built)."""
    bank, target = tmp_path / "bank", tmp_path / "target"
    shutil.copytree(world.bank, bank)
    shutil.copytree(world.target, target)
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank), target=f"hf:{target}")
    result = run_ptc("lock", recipe)
    assert result.returncode == 0 and "recipe.lock: written" in result.stdout, result.stderr
    # nothing drifted yet
    assert run_ptc("build", recipe, "--locked", "--no-export").returncode == 0
    return recipe, bank, target


def _drift_lines(result) -> list[str]:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert "input(s) differ from the lock (--locked)" in lines[0]
    return lines[1:]


def test_locked_refuses_a_changed_descriptor(locked):
    recipe, bank, _ = locked
    store = Bank(bank)
    entry = store.descriptor("colour", "src")
    meta = {
        k: v for k, v in entry.meta.items() if k not in ("record_sha256", "tensors_sha256", "entry")
    }
    store.put_descriptor(
        "colour", "src", {**entry.tensors, "utd": entry.tensors["utd"] * 1.01}, meta
    )
    lines = _drift_lines(run_ptc("build", recipe, "--locked"))
    assert len(lines) == 1 and lines[0].startswith(
        "  inputs.terms[colour/src].descriptors[src].sha256: locked "
    )
    assert (
        entry.sha256[:16] in lines[0] and store.descriptor("colour", "src").sha256[:16] in lines[0]
    )


def test_locked_refuses_a_changed_target_weight(locked):
    from safetensors.torch import load_file, save_file

    recipe, _, target = locked
    weights = load_file(target / "model.safetensors")
    name = next(
        k
        for k in sorted(weights)
        if k.startswith("vision_model.") and weights[k].is_floating_point()
    )
    weights[name] = weights[name] + 1e-3
    save_file(weights, target / "model.safetensors", metadata={"format": "pt"})
    lines = _drift_lines(run_ptc("build", recipe, "--locked"))
    assert [line.split(":")[0].strip() for line in lines] == ["inputs.target.input_fingerprint"]
    assert not (recipe.parent / "out").exists()


def test_locked_refuses_another_ptc_or_library_version(locked, monkeypatch):
    from ptc.compiler.recipe import lock as lockfile

    recipe, _, _ = locked
    real = lockfile.library_versions()
    monkeypatch.setattr(
        lockfile, "library_versions", lambda: {**real, "ptc": "9.9.9", "torch": "0.0.1"}
    )
    lines = _drift_lines(run_ptc("build", recipe, "--locked"))
    assert lines == [
        f"  inputs.versions.ptc: locked {real['ptc']}, now 9.9.9",
        f"  inputs.versions.torch: locked {real['torch']}, now 0.0.1",
    ]


def test_a_build_without_locked_updates_the_lock_and_says_what_changed(locked):
    recipe, _, _ = locked
    text = recipe.read_text().replace("weight: -1.0", "weight: -0.5")
    recipe.write_text(text)
    result = run_ptc("build", recipe, "--no-export")
    # --no-export records nothing
    assert result.returncode == 0 and "recipe.lock" not in result.stdout
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    assert (
        "recipe.lock: updated" in result.stdout
        and "inputs.terms[shape/src].weight: -1.0 -> -0.5" in result.stdout
    )
    assert json.loads((recipe.parent / "recipe.lock").read_text())["outputs"]
    assert run_ptc("build", recipe, "--force").stdout.count("recipe.lock: unchanged") == 1


def test_verify_passes_an_untouched_output_and_finds_a_flipped_byte_in_any_file(built, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(built[0], out)
    result = run_ptc("verify", out)
    assert result.returncode == 0 and "0 problems" in result.stdout, result.stderr
    files = [p for p in sorted(out.rglob("*")) if p.is_file() and p.name not in RUN_FILES]
    assert {"ptc.lock", "report.json", "README.md", "model.safetensors"} <= {p.name for p in files}
    for path in files:
        original = path.read_bytes()
        damaged = bytearray(original)
        damaged[len(damaged) // 2] ^= 0x01
        path.write_bytes(bytes(damaged))
        result = run_ptc("verify", out)
        assert result.returncode != 0, path.relative_to(out)
        path.write_bytes(original)
    (out / "extra.txt").write_text("not built")
    result = run_ptc("verify", out)
    assert result.returncode == 3 and "extra.txt: not in the lock" in result.stderr


def test_diff_names_the_one_term_whose_weight_changed(world, tmp_path):
    locks = []
    for name, weight in (("a", -1.0), ("b", -0.25)):
        recipe = write_recipe(
            tmp_path / f"{name}.yaml",
            world,
            terms=[
                {"task": "colour", "source": "src", "weight": 0.5},
                {"task": "shape", "source": "src", "weight": weight},
            ],
        )
        assert run_ptc("lock", recipe).returncode == 0
        locks.append(tmp_path / f"{name}.lock")
    result = run_ptc("diff", *locks)
    assert result.returncode == 0, result.stderr
    term_lines = [line for line in result.stdout.splitlines() if "terms[" in line]
    assert term_lines == ["inputs.terms[shape/src].weight: -1.0 -> -0.25"]
    found = json.loads(run_ptc("diff", *locks, "--json").stdout)
    assert {d["path"] for d in found} == {
        "inputs.terms[shape/src].weight",
        "inputs.recipe_sha256",
        "lock_hash",
    }
    assert run_ptc("diff", locks[0], locks[0]).stdout.strip() == "identical"


def test_a_lock_that_is_not_ptcs_is_never_overwritten(world, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    (tmp_path / "recipe.lock").write_text("my own notes\n")
    result = run_ptc("lock", recipe)
    assert (
        result.returncode == 2 and "is not a ptc lock; ptc will not overwrite it" in result.stderr
    )
    assert (tmp_path / "recipe.lock").read_text() == "my own notes\n"


def test_the_committed_demo_lock_matches_the_demo_recipe():
    from conftest import REPO
    from ptc.compiler.recipe.lock import read_lock

    lock = read_lock(REPO / "recipes" / "demo.lock")
    import hashlib

    assert (
        lock["inputs"]["recipe_sha256"]
        == hashlib.sha256((REPO / "recipes" / "demo.yaml").read_bytes()).hexdigest()
    )
    assert lock["outputs"] and lock["inputs"]["target"]["ref"] == "hf:../zoo/models/clip"


def test_where_the_output_is_written_changes_no_output_byte_and_certify_still_finds_the_target(
    world, tmp_path
):
    """--out at another depth gives the same bytes in every output file (the lock stays
    unchanged); certify finds the target from run.json, also once the output was moved."""
    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    target = f"hf:{os.path.relpath(world.target, tmp_path)}"  # relative to the recipe, as committed recipes are
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank), target=target)
    outs = [tmp_path / "near", tmp_path / "far" / "away" / "edit"]
    states = []
    for out in outs:
        result = run_ptc("build", recipe, "--out", out)
        assert result.returncode == 0, result.stderr
        states.append(result.stdout.split("recipe.lock: ")[1].split()[0])
    assert states == ["written", "unchanged"]
    digests = [{k: v for k, v in tree_digest(out).items() if k not in RUN_FILES} for out in outs]
    assert digests[0] == digests[1] and "terms.safetensors" in digests[0]
    moved = tmp_path / "moved" / "edit"
    # run.json's path from the output no longer resolves; the absolute one does
    shutil.move(outs[1], moved)
    data = world.tasks["colour"].parent / "test"
    figures = [
        json.loads(run_ptc("certify", out, "--data", data, "--task", "colour", "--json").stdout)
        for out in (outs[0], moved)
    ]
    assert figures[0] == figures[1] and figures[0]["inputs"] > 0
