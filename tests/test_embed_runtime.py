"""Embedding passes on onnxruntime (compiler/export/onnx_embed.py): a build's target grids
embedded through the cached base export agree with the model's own torch passes to float
rounding, are cached apart from them, named in the lock, and chosen only where they apply."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import FAMILIES, run_ptc, write_recipe
from ptc import targets
from ptc.compiler import embed
from ptc.compiler.bank.store import Bank
from ptc.compiler.embed import CPU_RUN, embed_probe_files_for_edit, model_info, model_key
from ptc.compiler.export import runtime_speed
from ptc.compiler.export.onnx_embed import choose_runtime
from ptc.compiler.export.runtime_speed import (
    SAMPLE_INPUTS,
    images_per_second,
    machine_label,
    speed_key,
)
from ptc.compiler.export.tower_cache import cached_base, export_key
from ptc.devices import CPU, place
from ptc.errors import InputError
from ptc.targets.base import batch_len


def test_a_build_embeds_its_target_on_onnxruntime_apart_from_torch(world, bank_copy, tmp_path):
    target = targets.load(f"hf:{world.target}")
    key = model_key(target)
    for folder in (bank_copy / "embeddings").glob(f"{key}*"):
        shutil.rmtree(folder)  # whatever other tests cached: this build embeds afresh
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    built = run_ptc("build", recipe, "--json")  # auto, and the build writes ONNX: onnxruntime
    assert built.returncode == 0, built.stderr
    result = json.loads(built.stdout)
    assert result["run"]["cache"]["embeddings_computed"] == 2
    assert "export_base" in result["run"]["timings"]
    lock = json.loads((tmp_path / "recipe.lock").read_text())
    assert {made["runtime"] for made in lock["edit"]["embeddings"].values()} == {"onnxruntime"}

    # The same grids through torch: cached under another key, the same numbers to rounding.
    again = run_ptc("build", recipe, "--embed-runtime", "torch", "--no-export")
    assert again.returncode == 0, again.stderr
    bank = Bank(bank_copy)
    for name in ("colour", "shape"):
        task = bank.task(name)
        ort = bank.read_entry(bank.embeddings_rel(f"{key}-onnxruntime", task.grid_hash))
        eager = bank.read_entry(bank.embeddings_rel(key, task.grid_hash))
        assert ort is not None and eager is not None
        assert (ort.meta["runtime"], eager.meta["runtime"]) == ("onnxruntime", "torch")
        with torch.inference_mode():  # an independent pass over the probe files
            expected = target.embed_inputs(target.load_inputs(list(task.probes)))
        assert (ort.tensors["inputs"] - expected).abs().max() < 1e-5
        assert torch.equal(eager.tensors["inputs"], expected)
        assert torch.equal(ort.tensors["prompts"], eager.tensors["prompts"])  # torch's, both


def test_onnxruntime_is_chosen_only_where_it_applies(world, tmp_path):
    bank = Bank(tmp_path / "bank")
    clip = targets.load(f"hf:{world.target}")
    assert choose_runtime(clip, bank, "auto", export_due=False) == "torch"  # nothing to reuse
    assert choose_runtime(clip, bank, "auto", export_due=True) == "onnxruntime"
    assert choose_runtime(clip, bank, "torch", export_due=True) == "torch"
    tower = clip.onnx_towers()[0]  # once its base export is cached, a pass reuses it
    cached_base(bank, export_key(model_info(clip).weights_key, tower), tower)
    assert choose_runtime(clip, bank, "auto", export_due=False) == "onnxruntime"
    place(clip, CPU, "bf16")
    assert choose_runtime(clip, bank, "auto", export_due=True) == "torch"
    with pytest.raises(InputError, match=r"passes run in bf16 \(onnxruntime runs the fp32 graph\)"):
        choose_runtime(clip, bank, "onnxruntime", export_due=True)
    build, scheme = FAMILIES["hf-siglip"]
    siglip = targets.load(scheme.format(build(tmp_path / "siglip", seed=0)))
    assert choose_runtime(siglip, bank, "auto", export_due=True) == "torch"
    with pytest.raises(InputError, match="its edit acts through rows inside the input tower"):
        choose_runtime(siglip, bank, "onnxruntime", export_due=True)


def test_a_runtime_that_cannot_run_is_refused_in_one_line_before_any_pass(world, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    result = run_ptc(
        "build", recipe, "--embed-runtime", "onnxruntime", "--precision", "bf16", "--no-export"
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"ptc: error: --embed-runtime onnxruntime: not for hf:{world.target}: its passes run "
        "in bf16 (onnxruntime runs the fp32 graph) (hint: use --embed-runtime auto (it picks "
        "torch there) or torch)"
    ]


def _runtime_records(bank: Path) -> list[Path]:
    return sorted(bank.glob("runtimes/*.json"))


def test_auto_measures_both_runtimes_once_per_model_and_machine(world, bank_copy, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    for record in _runtime_records(bank_copy):
        record.unlink()  # what other tests measured: this build measures afresh
    built = run_ptc("build", recipe, "--json")
    assert built.returncode == 0, built.stderr
    assert "measure_runtime" in json.loads(built.stdout)["run"]["timings"]
    (path,) = _runtime_records(bank_copy)
    record = Bank(bank_copy).runtime_speed(path.stem)
    assert record is not None
    rates = record["images_per_second"]
    assert rates["torch"] > 0 and rates["onnxruntime"] > 0 and record["inputs"] == SAMPLE_INPUTS
    expected = "onnxruntime" if rates["onnxruntime"] >= 0.95 * rates["torch"] else "torch"
    assert record["chosen"] == expected
    assert record["machine"] == machine_label()
    assert path.stem == speed_key(
        model_info(targets.load(f"hf:{world.target}")).weights_key, machine_label()
    )
    lock = json.loads((tmp_path / "recipe.lock").read_text())
    assert {made["runtime"] for made in lock["edit"]["embeddings"].values()} == {expected}

    shown = json.loads(run_ptc("bank", "show", "--bank", bank_copy, "--json").stdout)
    assert shown["runtimes"] == [
        {k: record[k] for k in ("model_ref", "machine", "images_per_second", "chosen")}
    ]

    written = path.read_bytes()
    again = run_ptc("build", recipe, "--force", "--json")  # read, not measured again
    assert again.returncode == 0, again.stderr
    assert "measure_runtime" not in json.loads(again.stdout)["run"]["timings"]
    assert path.read_bytes() == written


def test_cpu_passes_run_in_the_runs_auto_timed_where_a_run_is_work_enough(world, monkeypatch):
    """On a CPU a batch runs in runs of CPU_RUN (the run `auto` times each runtime on, at least
    two rounds) where one takes BUSY_SECONDS; a tiny model's runs are mostly fixed cost, and its
    batches run whole after the run that decided it."""
    target = targets.load(f"hf:{world.target}")
    paths = sorted((world.root / "world").rglob("*.png"))[:19]
    assert len(paths) == 19 and CPU_RUN == 8
    runs: list[int] = []

    def counted(batch):
        runs.append(batch_len(batch))
        return target.embed_for_edit(batch)

    with torch.inference_mode():
        whole, _ = target.embed_for_edit(target.load_inputs(paths))  # one pass, independent
        twice = torch.cat([whole, whole])
        z, _ = embed_probe_files_for_edit(target, paths + paths, 64, "runs", False, counted)
        assert runs == [8, 8, 22]  # the tiny target: its second run is far below BUSY_SECONDS
        assert (z - twice).abs().max() < 1e-6
        monkeypatch.setattr(embed, "BUSY_SECONDS", 0.0)  # as a real-size model's run takes
        runs.clear()
        z, _ = embed_probe_files_for_edit(target, paths + paths, 64, "runs", False, counted)
        assert runs == [8, 8, 8, 8, 6]  # not one run of 38: --batch-size 64 is more than that
        assert (z - twice).abs().max() < 1e-6

    runs.clear()  # a runtime that has run MIN_SECONDS after one round still runs two
    monkeypatch.setattr(runtime_speed, "MIN_SECONDS", 0.0)
    rate = images_per_second(counted, target.load_inputs(paths[:SAMPLE_INPUTS]))
    assert runs == [1, 8, 8] and rate > 0  # a warm-up input, then two rounds of 8


def test_rows_an_edit_acts_through_are_joined_across_runs_in_order(world, tmp_path, monkeypatch):
    """SigLIP's edit acts through rows inside its tower (so400m embeds on torch): split into
    runs, its (z, R) pairs join in input order, as one pass over the whole batch gives them."""
    build, scheme = FAMILIES["hf-siglip"]
    siglip = targets.load(scheme.format(build(tmp_path / "siglip", seed=0)))
    paths = sorted((world.root / "world").rglob("*.png"))[:19]
    monkeypatch.setattr(embed, "BUSY_SECONDS", 0.0)
    with torch.inference_mode():
        z, r = embed_probe_files_for_edit(siglip, paths, 64, "runs", False)
        whole_z, whole_r = siglip.embed_for_edit(siglip.load_inputs(paths))
    assert whole_r is not None and r is not None and r.shape == whole_r.shape
    assert (z - whole_z).abs().max() < 1e-5 and (r - whole_r).abs().max() < 1e-5


def test_a_recorded_faster_torch_makes_auto_embed_on_torch(world, bank_copy, tmp_path):
    """Where onnxruntime measured slower here (ViT-H/14 on an AMD EPYC: 0.89x), `auto` embeds on
    torch: the record, written as a measurement writes it, decides."""
    target = targets.load(f"hf:{world.target}")
    weights_key = model_info(target).weights_key
    for record in _runtime_records(bank_copy):
        record.unlink()
    Bank(bank_copy).put_runtime_speed(
        speed_key(weights_key, machine_label()),
        {
            "model_ref": target.ref,
            "machine": machine_label(),
            "images_per_second": {"torch": 10.0, "onnxruntime": 8.9},
            "inputs": 4,
            "chosen": "torch",
        },
    )
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    built = run_ptc("build", recipe, "--json")
    assert built.returncode == 0, built.stderr
    timings = json.loads(built.stdout)["run"]["timings"]
    # nothing of onnxruntime's before the embed stage (the export stage makes the base exports)
    assert "measure_runtime" not in timings and "open_session" not in timings
    lock = json.loads((tmp_path / "recipe.lock").read_text())
    assert {made["runtime"] for made in lock["edit"]["embeddings"].values()} == {"torch"}


def test_a_damaged_runtime_record_is_refused_in_one_line(world, bank_copy, tmp_path):
    target = targets.load(f"hf:{world.target}")
    key = speed_key(model_info(target).weights_key, machine_label())
    bank = Bank(bank_copy)
    bank.put_runtime_speed(
        key,
        {
            "images_per_second": {"torch": 1.0, "onnxruntime": 2.0},
            "inputs": 4,
            "chosen": "onnxruntime",
        },
    )
    path = bank_copy / "runtimes" / f"{key}.json"
    path.write_text(path.read_text().replace('"chosen": "onnxruntime"', '"chosen": "torch"'))
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    result = run_ptc("build", recipe, "-q")  # writes ONNX: onnxruntime is a candidate
    assert result.returncode == 2
    assert not (tmp_path / "out").exists()
    assert result.stderr.strip().splitlines() == [
        f"ptc: error: bank runtime record {path} failed its integrity check (modified, or copied "
        "from elsewhere) (hint: delete it: the next build that embeds on `--embed-runtime auto` "
        "measures again)"
    ]
    verified = run_ptc("bank", "verify", "--bank", bank_copy)
    assert verified.returncode != 0
    assert (
        f"bank runtime record {path} failed its integrity check"
        in verified.stdout + verified.stderr
    )


def test_the_torch_reference_of_the_check_inputs_is_computed_once_and_kept_in_the_bank(
    world, bank_copy, tmp_path
):
    """Grids embedded on onnxruntime are not torch's numbers to the last bit, so the folded edit
    is verified against the target's own torch fp32 pass over the check inputs: computed by the
    first build, sealed in the bank under the target and those inputs, read by every later one."""
    shutil.rmtree(bank_copy / "checks", ignore_errors=True)  # what other tests stored
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    args = ("build", recipe, "--embed-runtime", "onnxruntime", "--force", "--json")
    first = run_ptc(*args)
    assert first.returncode == 0, first.stderr
    first_run = json.loads(first.stdout)
    assert first_run["run"]["cache"]["check_references_computed"] == 1

    target = targets.load(f"hf:{world.target}")
    (stored,) = (bank_copy / "checks").rglob("*.safetensors")
    entry = Bank(bank_copy).read_entry(str(stored.relative_to(bank_copy)))
    assert entry is not None and stored.parent.name == model_info(target).weights_key
    assert (entry.meta["kind"], entry.meta["runtime"], entry.meta["precision"]) == (
        "check_reference",
        "torch",
        "fp32",
    )
    checked = first_run["report"]["verify"]["equivalence"]["check_inputs"]
    assert entry.meta["inputs"] == checked == entry.tensors["inputs"].shape[0]
    # Each stored row is torch's embedding of one of the grids' probe files (an independent pass).
    bank = Bank(bank_copy)
    probes = [p for name in ("colour", "shape") for p in bank.task(name).probes]
    with torch.inference_mode():
        every = target.embed_inputs(target.load_inputs(probes))
    nearest = torch.cdist(entry.tensors["inputs"].double(), every.double()).min(dim=1)
    assert nearest.values.max() < 1e-5
    assert len(set(nearest.indices.tolist())) == checked  # distinct probes

    again = run_ptc(*args)  # read from the bank: no torch pass of the target's check batch
    assert again.returncode == 0, again.stderr
    again_run = json.loads(again.stdout)
    assert again_run["run"]["cache"]["check_references_computed"] == 0
    assert (
        again_run["report"]["verify"]["equivalence"]["torch_max_abs_diff"]
        == first_run["report"]["verify"]["equivalence"]["torch_max_abs_diff"]
    )
    # Grids embedded on torch in fp32 are the reference themselves: nothing stored for them.
    on_torch = run_ptc("build", recipe, "--embed-runtime", "torch", "--force", "--json")
    assert on_torch.returncode == 0, on_torch.stderr
    assert json.loads(on_torch.stdout)["run"]["cache"]["check_references_computed"] == 0


def test_builds_that_need_one_measurement_take_turns(tmp_path, monkeypatch):
    """Two first builds of one model at once: one times the runtimes, the other waits for its
    record (timings that share the cores with another build's decide wrongly)."""
    import threading
    import time

    bank = Bank(tmp_path / "bank")
    bank.put_runtime_speed("unrelated", {"chosen": "torch"})  # the bank exists
    measured: list[str] = []
    both_asked = threading.Barrier(2)

    def measure() -> str:
        measured.append(threading.current_thread().name)
        time.sleep(0.5)  # the other build asks meanwhile
        record = {"model_ref": "hf:m", "machine": machine_label(), "chosen": "onnxruntime"}
        bank.put_runtime_speed(speed_key("weights", machine_label()), record)
        return "onnxruntime"

    chosen: dict[str, str] = {}

    def build(name: str) -> None:
        both_asked.wait()
        chosen[name] = runtime_speed.chosen_runtime(bank, "weights", measure)

    threads = [threading.Thread(target=build, args=(n,), name=n) for n in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(measured) == 1 and chosen == {"a": "onnxruntime", "b": "onnxruntime"}

    # A bank that cannot be written has no lock to take: each build measures for itself.
    def refuse(name: str):
        raise PermissionError(13, "Permission denied", name)

    monkeypatch.setattr(Bank, "lock", lambda self, name: refuse(name))
    assert runtime_speed.chosen_runtime(bank, "other", lambda: "torch") == "torch"


def test_each_towers_one_time_base_export_is_timed_apart_from_the_edited_graph(
    world, bank_copy, tmp_path
):
    """A model's first build exports every tower's base graph into the bank once, in a stage of
    its own (`export_base`), whatever runtime embedded it; later builds only copy and patch."""
    shutil.rmtree(bank_copy / "exports", ignore_errors=True)
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    args = ("build", recipe, "--embed-runtime", "torch", "--force", "--json")
    first = run_ptc(*args)
    assert first.returncode == 0, first.stderr
    run = json.loads(first.stdout)["run"]
    assert run["timings"]["export_base"] > 0
    assert run["cache"]["onnx_towers_patched"] + run["cache"]["onnx_towers_reused"] == 2
    sealed = sorted(p.stem for p in (bank_copy / "exports").glob("*/*.json"))
    assert sealed == ["text_model", "vision_model"]
    again = run_ptc(*args)
    assert again.returncode == 0, again.stderr
    assert "export_base" not in json.loads(again.stdout)["run"]["timings"]
