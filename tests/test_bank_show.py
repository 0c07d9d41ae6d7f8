"""`ptc bank show`: what a bank holds, read off its entries' records and checked against the
bank's own API and the files on disk."""

from __future__ import annotations

import json
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
