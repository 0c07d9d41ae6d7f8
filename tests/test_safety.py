"""No code execution on load; crash safety under SIGKILL; concurrent builds on one bank."""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, write_recipe
from ptc.compiler.bank.store import Bank
from ptc.output_dirs import remove_stale_staging

# -- forbidden calls ------------------------------------------------------------------------------
SAFE_YAML_LOADERS = {"_StrictLoader", "SafeLoader", "yaml.SafeLoader", "CSafeLoader"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def forbidden_calls(source: str) -> list[str]:
    """Calls that can run code from a loaded file, found by walking the syntax tree."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            found += [
                f"import {m}"
                for m in modules
                if m.split(".")[0] in {"pickle", "cPickle", "dill", "marshal", "shelve"}
            ]
        if not isinstance(node, ast.Call):
            continue
        name, keywords = _name(node.func), {k.arg: k.value for k in node.keywords}
        if name in {"eval", "exec", "compile", "__import__"}:
            found.append(name)
        if name in {"torch.load", "th.load"} and not (
            isinstance(keywords.get("weights_only"), ast.Constant)
            and keywords["weights_only"].value is True
        ):
            found.append("torch.load without weights_only=True")
        if (
            name in {"yaml.load", "yaml.load_all"}
            and _name(keywords.get("Loader", ast.Name("?"))) not in SAFE_YAML_LOADERS
        ):
            found.append("yaml.load with an unsafe Loader")
        if name in {
            "yaml.unsafe_load",
            "yaml.full_load",
            "yaml.unsafe_load_all",
            "yaml.full_load_all",
        }:
            found.append(name)
        if (
            name in {"numpy.load", "np.load"}
            and isinstance(keywords.get("allow_pickle"), ast.Constant)
            and keywords["allow_pickle"].value
        ):
            found.append("np.load(allow_pickle=True)")
        trust = keywords.get("trust_remote_code")
        if trust is not None and not (isinstance(trust, ast.Constant) and trust.value is False):
            found.append("trust_remote_code not False")
    return found


def test_scanner_catches_planted_calls():
    planted = (
        "import pickle\nimport torch, yaml\ntorch.load('x')\nyaml.load(s, Loader=yaml.Loader)\n"
        "eval('1')\nAutoModel.from_pretrained(p, trust_remote_code=True)\nyaml.full_load(s)\n"
    )
    assert len(forbidden_calls(planted)) == 6
    assert (
        forbidden_calls(
            "torch.load('x', weights_only=True)\nmodel.eval()\nyaml.load(t, Loader=_StrictLoader)\n"
        )
        == []
    )


def test_no_code_execution_on_load_anywhere():
    files = [
        p
        for folder in ("ptc", "compiler", "targets", "lab", "benchmarks")
        for p in (REPO / folder).rglob("*.py")
    ]
    assert len(files) > 20
    problems = {
        str(p.relative_to(REPO)): calls for p in files if (calls := forbidden_calls(p.read_text()))
    }
    assert problems == {}
    import yaml

    from ptc import strict_yaml as yamlio

    assert issubclass(yamlio._StrictLoader, yaml.SafeLoader)


# -- crash safety ---------------------------------------------------------------------------------
def _complete(out: Path) -> bool:
    lock = json.loads((out / "ptc.lock").read_text())
    return (
        all(
            hashlib.sha256((out / n).read_bytes()).hexdigest() == sha
            for n, sha in lock["outputs"].items()
        )
        and (out / "report.json").is_file()
    )


def _ptc(*args) -> list[str]:
    return [sys.executable, "-m", "ptc.compiler.cli", *map(str, args)]


def test_sigkill_at_random_moments_leaves_bank_and_outputs_consistent(world, tmp_path):
    trials = int(os.environ.get("PTC_KILL_TRIALS", "12"))  # raise it for a soak run
    rng = random.Random(20261202)
    commands = {
        "descriptor": lambda bank, out: _ptc(
            "descriptor",
            "add",
            "--task",
            "shape",
            "--source",
            f"hf:{world.source}",
            "--finetuned",
            world.adapters["shape"],
            "--id",
            "killed",
            "--bank",
            bank,
        ),
        "build": lambda bank, out: _ptc(
            "build",
            write_recipe(
                tmp_path / f"{out.name}.yaml",
                world,
                bank=str(bank),
                export={"out": str(out), "formats": ["safetensors"]},
            ),
        ),
    }
    durations = {}
    for kind, make in commands.items():  # how long each takes undisturbed, on a fresh bank
        bank = tmp_path / f"timing-{kind}"
        shutil.copytree(world.bank, bank)
        start = time.perf_counter()
        subprocess.run(make(bank, tmp_path / f"timing-{kind}-out"), check=True, capture_output=True)
        durations[kind] = time.perf_counter() - start
    outcomes = {"finished": 0, "killed": 0}
    for trial in range(trials):
        kind = ("descriptor", "build")[trial % 2]
        bank, out = tmp_path / f"bank{trial}", tmp_path / f"out{trial}"
        shutil.copytree(world.bank, bank)
        # make the command write as much as it can
        for cache in ("embeddings", "factors", "operators", "checks"):
            shutil.rmtree(bank / cache, ignore_errors=True)
        process = subprocess.Popen(
            commands[kind](bank, out), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        time.sleep(rng.uniform(0.3, 1.0) * durations[kind])
        process.send_signal(signal.SIGKILL)
        outcomes["killed" if process.wait() == -signal.SIGKILL else "finished"] += 1
        checked, problems = Bank(bank).verify_all()
        assert problems == [], (trial, kind, problems)
        if kind == "descriptor" and "killed" in Bank(bank).descriptor_ids("shape"):
            assert Bank(bank).descriptor("shape", "killed").tensors["utd"].shape == (16, 3)
        if kind == "build":
            assert not out.exists() or _complete(out), trial
            # what the next build of this output does first
            remove_stale_staging(tmp_path, out.name)
            assert not list(tmp_path.glob(f".{out.name}.*")), trial
        shutil.rmtree(bank)
    assert outcomes["killed"] >= trials // 2, outcomes  # most trials really were interrupted


# -- concurrency ----------------------------------------------------------------------------------
@pytest.mark.parametrize("same_recipe", [True, False], ids=["same-recipe", "different-recipes"])
def test_two_builds_at_once_on_one_bank(world, tmp_path, same_recipe):
    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    for cache in ("embeddings", "factors", "operators", "checks"):
        shutil.rmtree(bank / cache, ignore_errors=True)
    terms_b = (
        None
        if same_recipe
        else [
            {"task": "colour", "source": "full", "weight": -0.5},
            {"task": "shape", "source": "src", "weight": 0.5},
        ]
    )
    recipes = [
        write_recipe(
            tmp_path / "a.yaml", world, bank=str(bank), export={"out": str(tmp_path / "out-a")}
        ),
        write_recipe(
            tmp_path / "b.yaml",
            world,
            terms=terms_b,
            bank=str(bank),
            export={"out": str(tmp_path / "out-b")},
        ),
    ]
    processes = [
        subprocess.Popen(
            _ptc("build", r), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for r in recipes
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=600)
        assert process.returncode == 0, stderr
    reports = [json.loads((tmp_path / o / "report.json").read_text()) for o in ("out-a", "out-b")]
    assert all(_complete(tmp_path / o) for o in ("out-a", "out-b"))
    assert Bank(bank).verify_all()[1] == []
    runs = [json.loads((tmp_path / o / "run.json").read_text()) for o in ("out-a", "out-b")]
    solved = sum(r["cache"]["operators_solved"] for r in runs)
    distinct_operators = {t["operator_sha256"] for r in reports for t in r["terms"]}
    assert solved == len(distinct_operators)  # every shared operator was computed exactly once
    assert sum(r["cache"]["factors_computed"] for r in runs) == 2  # one per grid
    if same_recipe:
        assert [t["operator_sha256"] for t in reports[0]["terms"]] == [
            t["operator_sha256"] for t in reports[1]["terms"]
        ]


def test_bank_verify_detects_a_flipped_bit_in_any_file(world, tmp_path):
    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    files = [p for p in sorted(bank.rglob("*")) if p.is_file() and ".locks" not in p.parts]
    assert (
        {".json", ".safetensors"}
        <= {p.suffix for p in files}
        <= {".json", ".safetensors", ".onnx", ".data"}
    )
    rng = random.Random(7)
    for path in files:
        original = path.read_bytes()
        for position in {0, 7, len(original) // 2, len(original) - 1, rng.randrange(len(original))}:
            damaged = bytearray(original)
            damaged[position] ^= 0x01
            path.write_bytes(bytes(damaged))
            assert Bank(bank).verify_all()[1], (str(path.relative_to(bank)), position)
        path.write_bytes(original)
    assert Bank(bank).verify_all()[1] == []


# -- entries bound to their keys ------------------------------------------------
def _swap(a: Path, b: Path) -> None:
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b)
    b.write_bytes(data_a)


def _grid_embeddings(bank: Path, grid: str) -> list[Path]:
    return sorted(bank.glob(f"embeddings/*/{grid}.safetensors"))


def test_swapped_embeddings_are_found_and_never_make_a_descriptor(world, tmp_path):
    """The source's and the fine-tune's cached embeddings of one grid, exchanged: each file's
    seal is intact, but each names the other's key. Before binding, verify passed and a new
    descriptor came out negated."""
    from conftest import run_ptc

    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    grid = Bank(bank).task("colour").grid_hash
    pair = _grid_embeddings(bank, grid)[:2]
    assert len(pair) == 2
    _swap(*pair)
    problems = Bank(bank).verify_all()[1]
    assert sum("holds the record of" in p and "swapped" in p for p in problems) == 2, problems
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "colour",
        "--source",
        f"hf:{world.source}",
        "--finetuned",
        world.adapters["colour"],
        "--id",
        "again",
        "--bank",
        bank,
    )
    assert result.returncode == 2 and "swapped, renamed or copied in" in result.stderr, (
        result.stderr
    )
    assert "again" not in Bank(bank).descriptor_ids("colour")


def test_swapped_renamed_and_foreign_descriptors_are_found(world, tmp_path):
    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    folder = bank / "descriptors" / "colour"
    _swap(folder / "src.safetensors", folder / "full.safetensors")
    problems = Bank(bank).verify_all()[1]
    assert len([p for p in problems if "holds the record of 'descriptors/colour/" in p]) == 2, (
        problems
    )
    _swap(folder / "src.safetensors", folder / "full.safetensors")
    (folder / "full.safetensors").rename(folder / "renamed.safetensors")
    assert any(
        "renamed.safetensors holds the record of 'descriptors/colour/full.safetensors'" in p
        for p in Bank(bank).verify_all()[1]
    )
    (folder / "renamed.safetensors").unlink()
    # From another bank, under the same key: its record is sealed and bound, but made on a grid
    # this bank's task does not have.
    other, ours = Bank(tmp_path / "other"), Bank(bank).descriptor("colour", "src")
    other.put_descriptor(
        "colour",
        "src",
        ours.tensors,
        {
            **{k: v for k, v in ours.meta.items() if k not in ("record_sha256", "entry")},
            "grid_hash": "e" * 64,
        },
    )
    shutil.copy(
        tmp_path / "other" / "descriptors" / "colour" / "src.safetensors",
        folder / "src.safetensors",
    )
    assert any("copied from another bank" in p for p in Bank(bank).verify_all()[1])


def _as_format_2(bank: Path) -> None:
    """Rewrite a bank the way ptc 0.1 (format 2) wrote it: records sealed but bound to nothing."""
    import safetensors.torch

    from ptc.compiler.bank.store import _sealed

    store = Bank(bank)
    for path in sorted(bank.rglob("*.safetensors")):
        entry = store.read_entry(str(path.relative_to(bank)))
        record = _sealed(
            {k: v for k, v in entry.meta.items() if k not in ("entry", "record_sha256")}
        )
        path.write_bytes(
            safetensors.torch.save(
                entry.tensors, metadata={"ptc": json.dumps(record, sort_keys=True)}
            )
        )
    (bank / "bank.json").write_text(json.dumps({"format": "ptc-bank", "version": 2}))


def test_a_format_2_bank_is_refused_until_upgraded_and_keeps_its_tensors(world, tmp_path):
    from conftest import run_ptc

    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    before = Bank(bank).descriptor("colour", "src").sha256
    _as_format_2(bank)
    result = run_ptc("task", "list", "--bank", bank)
    assert (
        result.returncode == 2
        and "has format 2" in result.stderr
        and "ptc bank upgrade" in result.stderr
    )
    result = run_ptc("bank", "upgrade", "--bank", bank)
    assert result.returncode == 0 and "re-sealed (format 3)" in result.stdout, result.stderr
    assert Bank(bank).verify_all()[1] == []
    assert Bank(bank).descriptor("colour", "src").sha256 == before


# -- round two: what ptc did not write, it never touches -------------------------------------------------
def test_force_replaces_a_ptc_output_only_while_everything_in_it_is_ptcs(world, built, tmp_path):
    from conftest import run_ptc

    out = tmp_path / "out"
    shutil.copytree(built[0], out)
    recipe = write_recipe(
        tmp_path / "recipe.yaml", world, export={"out": str(out), "formats": ["safetensors"]}
    )
    (out / "notes.txt").write_text("mine")
    result = run_ptc("build", recipe, "--force")
    assert result.returncode == 2 and "holds notes.txt, which ptc did not write" in result.stderr
    assert (out / "notes.txt").read_text() == "mine"
    (out / "notes.txt").unlink()
    (out / "README.md").write_text((out / "README.md").read_text() + "\nedited by hand\n")
    result = run_ptc("build", recipe, "--force")
    assert result.returncode == 2 and "holds README.md" in result.stderr
    assert (out / "README.md").read_text().endswith("edited by hand\n")
    # ptc's file back as it was (copy2 keeps its time)
    shutil.copy2(built[0] / "README.md", out / "README.md")
    result = run_ptc("build", recipe, "--force")  # wholly ptc's again: replaced
    assert result.returncode == 0, result.stderr
    assert not (out / "onnx").exists() and (out / "model").is_dir()  # the new build's formats only


def test_clean_up_removes_only_what_ptc_created(tmp_path):
    from ptc.files import remove_stale_temporaries
    from ptc.output_dirs import STAGING_MARKER, remove_stale_staging

    dead = 999_999_999  # no such process
    users = tmp_path / f".out.{dead}.abc.partial"  # matches the pattern, but is a user's folder
    users.mkdir()
    (users / "thesis.tex").write_text("mine")
    ours = tmp_path / f".out.{dead}.def.partial"
    ours.mkdir()
    (ours / STAGING_MARKER).write_text(f"{dead}\n")
    (ours / "model.safetensors").write_bytes(b"half")
    assert remove_stale_staging(tmp_path, "out") == [ours]
    assert (users / "thesis.tex").read_text() == "mine" and not ours.exists()
    user_file = tmp_path / f".notes.txt.{dead}.x.tmp"  # a user's file that looks like a temporary
    user_file.write_text("mine")
    assert remove_stale_temporaries(tmp_path / ".tmp") == [] and user_file.exists()


def test_a_filesystem_refusal_is_one_line_and_exit_2(world, tmp_path, monkeypatch):
    """A read-only bank (as root, chmod does not refuse, so the refusal is simulated where the
    bank writes: creating its temporary file)."""
    import tempfile

    from conftest import run_ptc

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(kwargs.get("dir", "")))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    result = run_ptc("task", "add", world.tasks["colour"], "--bank", tmp_path / "bank")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Permission denied" in lines[0], (
        result.stderr
    )


def test_sigterm_cleans_up_like_ctrl_c(world, tmp_path):
    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    out = tmp_path / "out"
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank), export={"out": str(out)})
    process = subprocess.Popen(
        _ptc("build", recipe), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while (
        not list(tmp_path.glob(".out.*.partial"))
        and process.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)  # wait for the export to begin: a staging folder exists
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 143, (process.returncode, stderr)
    # progress and notes come first on stderr (which depends on what the bank already held)
    assert (
        stderr.strip().splitlines()[-1] == "ptc: error: terminated (SIGTERM); nothing was written"
    )
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    assert Bank(bank).verify_all()[1] == []
