"""`ptc bank show`: what a bank holds, read off its entries' records and checked against the
bank's own API and the files on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import run_ptc
from ptc.compiler.bank.store import Bank


def test_bank_show_lists_every_task_descriptor_and_cache_with_what_made_it(world, built):
    bank = Bank(world.bank)
    result = run_ptc("bank", "show", "--bank", world.bank, "--json")
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert [t["task"] for t in shown["tasks"]] == bank.task_names()
    for task in shown["tasks"]:
        record = bank.task(task["task"])
        assert (task["probes"], task["classes"], task["grid"]) == (
            len(record.probes),
            len(record.classes),
            record.grid_hash,
        )
        assert [d["id"] for d in task["descriptors"]] == bank.descriptor_ids(task["task"])
        for d in task["descriptors"]:
            meta = bank.descriptor(task["task"], d["id"]).meta
            assert (d["source"], d["finetuned"], d["shape"]) == (
                meta["source_ref"],
                meta["finetuned_ref"],
                meta["shape"],
            )
    colour = next(t for t in shown["tasks"] if t["task"] == "colour")
    assert {d["id"]: d["finetuned"] for d in colour["descriptors"]}["src"] == str(
        world.adapters["colour"]
    )
    # The session build embedded the target's grids: one model's embeddings, every file counted.
    files = sorted((world.bank / "embeddings").rglob("*.safetensors"))
    assert sum(r["entries"] for r in shown["embeddings"]) == len(files)
    assert sum(r["bytes"] for r in shown["embeddings"]) == sum(p.stat().st_size for p in files)
    assert f"hf:{world.target}" in {r["model"] for r in shown["embeddings"]}
    text = run_ptc("bank", "show", "--bank", world.bank).stdout
    assert text.splitlines()[2].split() == [
        "TASK",
        "GRID",
        "HASH",
        "DESCRIPTOR",
        "SOURCE",
        "FINE-TUNE",
        "NORM",
    ]
    assert "embeddings:" in text and "operators:" in text


def test_bank_show_of_a_folder_that_is_no_bank_is_one_line_and_imports_no_torch(tmp_path, world):
    missing = run_ptc("bank", "show", "--bank", tmp_path / "nowhere")
    assert missing.returncode == 2
    assert missing.stderr.strip() == (
        f"ptc: error: no bank at {tmp_path / 'nowhere'} (no bank.json there) "
        "(hint: pass --bank DIR, or set $PTC_BANK; `ptc task add` makes one)"
    )
    imported = subprocess.run(
        [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "ptc.compiler.cli",
            "bank",
            "show",
            "--bank",
            str(world.bank),
        ],
        capture_output=True,
        text=True,
    )
    assert imported.returncode == 0, imported.stderr
    modules = {
        line.rsplit("|", 1)[-1].strip() for line in imported.stderr.splitlines() if "|" in line
    }
    assert "ptc.compiler.cli.bank_show" in modules and "torch" not in modules


def test_a_build_names_its_base_exports_in_its_lock_and_the_bank_remembers_the_lock(world, built):
    out, _ = built
    lock = json.loads((out / "ptc.lock").read_text())
    named = lock["edit"]["base_exports"]
    assert sorted(named) == ["text_model", "vision_model"]
    for tower, key in named.items():  # each a sealed export the bank holds
        assert Bank(world.bank).export_problem(key, tower) is None
    remembered = json.loads((world.bank / "locks.json").read_text())["locks"]
    assert str((out / "ptc.lock").resolve()) in remembered
    assert str((out.parent / "recipe.lock").resolve()) in remembered
    shown = json.loads(run_ptc("bank", "show", "--bank", world.bank, "--json").stdout)
    rows = {e["key"]: e for e in shown["exports"]}
    for key in set(named.values()):
        assert str((out / "ptc.lock").resolve()) in rows[key]["locked_by"]
        assert rows[key]["last_used"].endswith("UTC")
    # the space each part takes: every file under it, as on disk
    for part, size in shown["parts"].items():
        assert size == sum(p.stat().st_size for p in (world.bank / part).rglob("*") if p.is_file())
    assert shown["parts"]["exports"] == sum(e["bytes"] for e in shown["exports"]) > 0


def test_bank_prune_removes_the_least_recently_used_exports_and_keeps_what_a_lock_names(
    world, built, bank_copy
):
    from ptc import targets
    from ptc.compiler.export import tower_cache

    out, _ = built
    locked = set(json.loads((out / "ptc.lock").read_text())["edit"]["base_exports"].values())
    # An export no lock names, last used long ago: a real export of another model's tower.
    tower = targets.load(f"hf:{world.source}").onnx_towers()[1]
    stale = tower_cache.export_key("another-model", tower)
    tower_cache.cached_base(Bank(bank_copy), stale, tower)
    os.utime(bank_copy / "exports" / stale / f"{tower.name}.json", (1.6e9, 1.6e9))
    exports = bank_copy / "exports"
    before = sorted(p.name for p in exports.iterdir())
    assert sorted(before) == sorted(locked | {stale})

    dry = run_ptc("bank", "prune", "--bank", bank_copy, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    report = json.loads(dry.stdout)
    assert [r["key"] for r in report["removed"]] == [stale]
    assert report["removed"][0]["last_used"] == "2020-09-13 12:26 UTC"
    assert {r["key"] for r in report["kept_locked"]} == locked
    assert sorted(p.name for p in exports.iterdir()) == before  # a dry run touches nothing

    # Under the cap already: nothing to do.
    roomy = run_ptc("bank", "prune", "--bank", bank_copy, "--max-size", "1GB")
    assert roomy.returncode == 0 and "(removed 0, 0.0 kB)" in roomy.stdout
    # A cap the locked exports alone exceed: the stale one goes, the locked ones stay, and it says so.
    pruned = run_ptc("bank", "prune", "--bank", bank_copy, "--max-size", "1kB")
    assert pruned.returncode == 0, pruned.stderr
    lines = pruned.stdout.splitlines()
    assert lines[0].startswith(f"removed exports/{stale} (text_model; ")
    assert sum(line.startswith("kept exports/") for line in lines) == len(locked)
    assert lines[-1].endswith("; still over 1.0 kB: locked exports are kept")
    assert sorted(p.name for p in exports.iterdir()) == sorted(locked)
    assert Bank(bank_copy).verify_all()[1] == []  # what is left is whole
    # A damaged lock list is refused, not read as "no locks": nothing is removed.
    listed = bank_copy / "locks.json"
    kept = listed.read_bytes()
    listed.write_bytes(kept.replace(b"ptc.lock", b"ptc.lockx"))
    refused = run_ptc("bank", "prune", "--bank", bank_copy)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert f"bank lock list {listed} failed its integrity check" in refused.stderr
    assert sorted(p.name for p in exports.iterdir()) == sorted(locked)
    shown = json.loads(run_ptc("bank", "show", "--bank", bank_copy, "--json").stdout)
    assert "failed its integrity check" in shown["unreadable"]["locks.json"]
    listed.write_bytes(kept)
    # Asked to, it removes locked ones too; the embeddings and operators stay.
    everything = run_ptc("bank", "prune", "--bank", bank_copy, "--include-locked")
    assert everything.returncode == 0 and list(exports.iterdir()) == []
    assert sorted((bank_copy / "operators").rglob("*.safetensors"))

    bad = run_ptc("bank", "prune", "--bank", bank_copy, "--max-size", "lots")
    assert bad.returncode == 2
    assert "'lots' is not a size (like 20GB, 500MB or 1.5TB)" in bad.stderr
