"""`ptc build` end to end on tiny HF CLIP models of different widths, checked against
independent computations: transformers and onnxruntime directly, not ptc's own verify."""

import hashlib
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import safetensors.torch
import torch
from transformers import CLIPModel

from conftest import built_key, clip_pixels, run_ptc, write_recipe
from ptc import targets
from ptc.compiler.bank.store import Bank


def _edit_operator(world, report):
    """A = sum w_l A_l, read back from the bank's operator files by the hashes in the report."""
    bank = Bank(world.bank)
    key = built_key(targets.load(f"hf:{world.target}"), report)
    total = torch.zeros(24, 24, dtype=torch.float64)
    for term in report["terms"]:
        entry = bank.read_entry(
            bank.operator_rel(key, term["grid_hash"], term["descriptor_sha256"], 1.0)
        )
        assert entry.sha256 == term["operator_sha256"]
        total += term["weight"] * entry.tensors["operator"].double()
    return total


def test_build_writes_the_output_contract(built):
    out, result = built
    for name in (
        "model/config.json",
        "model/model.safetensors",
        "model/tokenizer.json",
        "model/preprocessor_config.json",
        "onnx/vision_model.onnx",
        "onnx/text_model.onnx",
        "report.json",
        "recipe.yaml",
        "ptc.lock",
        "README.md",
    ):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())
    verify = report["verify"]
    assert verify["linearity"]["max_rel_diff_fp64"] <= 1e-12
    assert verify["linearity"]["max_rel_diff_fp32"] <= 1e-6
    for figure in ("torch_max_abs_diff", "onnx_max_abs_diff", "reload_max_abs_diff"):
        assert verify["equivalence"][figure] <= 1e-5
    # this run's record, apart from the reproducible report
    run = json.loads((out / "run.json").read_text())
    assert {"load", "embed", "solve", "fold", "export_onnx"} <= set(
        run["timings"]
    ) and "timings" not in report
    by_stage = run["peak_rss_mb_by_stage"]  # every stage's own peak, none above the build's
    assert set(run["timings"]) <= set(by_stage)
    assert 0 < min(by_stage.values()) and max(by_stage.values()) <= run["peak_rss_mb"]
    assert [t["task"] for t in report["terms"]] == ["colour", "shape"]
    assert (out / "recipe.yaml").read_bytes() == (out.parent / "recipe.yaml").read_bytes()
    assert "linearity fp64" in result.stdout
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_lock_hashes_every_output_file(built):
    out, _ = built
    lock = json.loads((out / "ptc.lock").read_text())
    assert lock["outputs"]
    for name, sha in lock["outputs"].items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == sha
    assert lock["lock_hash"] == json.loads((out / "report.json").read_text())["lock_hash"]
    assert lock["lock_hash"] in (out / "README.md").read_text()


def test_saved_model_is_the_base_with_the_folded_edit(world, built):
    out, _ = built
    report = json.loads((out / "report.json").read_text())
    operator = _edit_operator(world, report)
    assert float(operator.norm()) > 0
    base = CLIPModel.from_pretrained(world.target).eval()
    edited = CLIPModel.from_pretrained(out / "model").eval()
    probes = sorted((world.tasks["colour"].parent / "test").rglob("*.png"))[:9]
    pixels = clip_pixels(probes, world.target)
    with torch.no_grad():
        z = base.get_image_features(pixel_values=pixels).pooler_output.double()
        got = edited.get_image_features(pixel_values=pixels).pooler_output.double()
    expected = z @ (torch.eye(24, dtype=torch.float64) + operator).T
    assert (got - expected).abs().max() < 1e-5
    assert (got - z).abs().max() > 1e-4  # the edit did something
    # Only the projection changed: every other tensor is bit-identical.
    base_sd, edited_sd = base.state_dict(), edited.state_dict()
    changed = [k for k in base_sd if not torch.equal(base_sd[k], edited_sd[k])]
    assert changed == ["visual_projection.weight"]


def test_onnx_towers_match_torch_at_any_batch(world, built):
    out, _ = built
    edited = CLIPModel.from_pretrained(out / "model").eval()
    vision = ort.InferenceSession(
        str(out / "onnx" / "vision_model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [i.name for i in vision.get_inputs()] == ["pixel_values"]
    assert [o.name for o in vision.get_outputs()] == ["image_embeds"]
    probes = sorted((world.tasks["shape"].parent / "test").rglob("*.png"))
    for count in (1, 3, 7):
        pixels = clip_pixels(probes[:count], world.target)
        (got,) = vision.run(None, {"pixel_values": pixels.numpy()})
        with torch.no_grad():
            want = edited.get_image_features(pixel_values=pixels).pooler_output.numpy()
        assert got.shape == (count, 24) and np.abs(got - want).max() < 1e-5
    text = ort.InferenceSession(
        str(out / "onnx" / "text_model.onnx"), providers=["CPUExecutionProvider"]
    )
    from transformers import AutoTokenizer

    tokens = AutoTokenizer.from_pretrained(out / "model")(
        ["a red thing.", "a photo of a circle shape.", "x"], padding=True, return_tensors="pt"
    )
    (got,) = text.run(
        None,
        {
            "input_ids": tokens["input_ids"].numpy(),
            "attention_mask": tokens["attention_mask"].numpy(),
        },
    )
    with torch.no_grad():
        want = edited.get_text_features(**tokens).pooler_output.numpy()
    assert np.abs(got - want).max() < 1e-5


def test_warm_rebuild_runs_no_forward_pass_and_is_reproducible(world, built, tmp_path):
    out, _ = built
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    again = json.loads((tmp_path / "out" / "report.json").read_text())
    cache = json.loads((tmp_path / "out" / "run.json").read_text())["cache"]
    assert cache == {
        "embeddings_computed": 0,
        "factors_computed": 0,
        "operators_solved": 0,
        "check_references_computed": 0,
        "onnx_towers_patched": 1,
        "onnx_towers_reused": 1,
    }  # the base towers were exported before
    first = json.loads((out / "report.json").read_text())
    assert [t["operator_sha256"] for t in again["terms"]] == [
        t["operator_sha256"] for t in first["terms"]
    ]
    a = safetensors.torch.load_file(out / "model" / "model.safetensors")
    b = safetensors.torch.load_file(tmp_path / "out" / "model" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_eval_reads_a_build_output_and_a_reference(world, built):
    out, _ = built
    test_dir = world.tasks["colour"].parent / "test"
    for model in (str(out), f"hf:{world.target}"):
        result = run_ptc(
            "eval", model, "--task", "colour", "--data", test_dir, "--bank", world.bank, "--json"
        )
        assert result.returncode == 0, result.stderr
        figures = json.loads(result.stdout)
        assert figures["total"] == 24 and 0 <= figures["accuracy"] <= 1
    # Independent zero-shot accuracy of the edited model with transformers alone.
    from transformers import AutoTokenizer

    model = CLIPModel.from_pretrained(out / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(out / "model")
    task = Bank(world.bank).task("colour")
    with torch.no_grad():
        text = model.get_text_features(
            **tokenizer(task.prompts, padding=True, return_tensors="pt")
        ).pooler_output
        text = (
            torch.nn.functional.normalize(text, dim=-1)
            .reshape(len(task.classes), len(task.templates), -1)
            .mean(1)
        )
        text = torch.nn.functional.normalize(text, dim=-1)
        files = [(f, task.classes.index(f.parent.name)) for f in sorted(test_dir.rglob("*.png"))]
        pixels = clip_pixels([f for f, _ in files], out / "model")
        image = torch.nn.functional.normalize(
            model.get_image_features(pixel_values=pixels).pooler_output, dim=-1
        )
    predicted = (image @ text.T).argmax(1)
    accuracy = float((predicted == torch.tensor([c for _, c in files])).float().mean())
    result = run_ptc(
        "eval", str(out), "--task", "colour", "--data", test_dir, "--bank", world.bank, "--json"
    )
    assert json.loads(result.stdout)["accuracy"] == pytest.approx(accuracy, abs=1e-9)


def test_no_export_verifies_and_writes_nothing(world, built, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    result = run_ptc("build", recipe, "--no-export")
    assert result.returncode == 0, result.stderr
    assert "nothing written" in result.stdout and "linearity fp64" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]


EXPORT_SIGLIP = """
import sys
from pathlib import Path
from ptc import targets
from ptc.compiler.export.onnx_graph import export_onnx
from ptc.lab.tiny.hf_siglip import build_tiny
folder = build_tiny(Path(sys.argv[1]) / "siglip", width=40, seed=0)
export_onnx(targets.load(f"hf:{folder}").onnx_towers()[0], Path(sys.argv[1]) / "vision_model.onnx")
"""


def test_the_onnx_export_prints_no_exporter_chatter(tmp_path):
    """SigLIP's head has ops the exporter's optimizer leaves unfolded, each with a log warning
    that is the exporter developers' business; run as a user runs it, in a process of its own."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", EXPORT_SIGLIP, str(tmp_path)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "vision_model.onnx.data").is_file()
    for chatter in ("Skipping constant folding", "[torch.onnx]", "Translate the graph"):
        assert chatter not in result.stderr and chatter not in result.stdout, (
            chatter,
            result.stderr,
        )


def test_a_redirected_build_reports_its_long_steps_and_q_silences_them(world, tmp_path):
    """stderr captured (a log file, CI): each embedding step says how far it got and how long it
    took, in plain lines, and stdout ends with the build's summary; `-q` leaves stderr empty.
    The flags go after the command as well as before it."""
    import re
    import shutil

    bank = tmp_path / "bank"  # a private copy: builds of other tests fill the session's cache
    shutil.copytree(world.bank, bank)
    shutil.rmtree(bank / "embeddings")  # cold: every grid is embedded
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank))
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    done = [line for line in result.stderr.splitlines() if line.endswith(" done")]
    assert any(
        re.fullmatch(r"embed colour: (\d+)/\1 batches, \d+\.\d s done", line) for line in done
    ), result.stderr
    assert "\r" not in result.stderr
    assert result.stdout.splitlines()[-2].startswith("built ")  # then the lock's line
    shutil.rmtree(bank / "embeddings")  # cold again
    quiet = run_ptc("build", recipe, "-q", "--no-export")
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    assert quiet.stdout.splitlines()[-1].startswith("verified (--no-export")
    shutil.rmtree(bank / "embeddings")
    verbose = run_ptc("build", recipe, "--no-export", "-v")
    assert verbose.returncode == 0 and "embed colour:" in verbose.stderr
    assert re.search(r"^stages: .*embed \d+\.\d\ds", verbose.stdout, re.M), verbose.stdout
    as_json = json.loads(run_ptc("build", recipe, "--no-export", "-q", "--json").stdout)
    assert (
        as_json["out"] is None
        and as_json["report"]["verify"]["linearity"]["max_rel_diff_fp64"] < 1e-12
    )
    both = run_ptc("build", recipe, "-q", "-v")
    assert both.returncode == 2 and both.stderr.startswith(
        "ptc: error: -q and -v: give one or the other"
    )


def test_each_stage_records_its_own_peak_memory():
    """The stage that allocates holds the peak; the stages after it do not inherit it."""
    from ptc.compiler.edit.routes import Run
    from ptc.memory import peak_rss_mb

    run = Run()
    with run.stage("before"):
        pass
    with run.stage("allocate"):
        block = bytearray(256 << 20)  # zero-filled: every page touched
        del block
    with run.stage("after"):
        with run.stage("inner"):
            pass
    run.close_stretch()
    assert run.peaks["allocate"] - run.peaks["before"] > 240
    assert run.peaks["after"] < run.peaks["allocate"] - 240
    assert run.peaks["inner"] <= run.peaks["after"]
    assert peak_rss_mb() >= run.peaks["allocate"]  # the whole life's peak is kept


def _resident_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


def _cached_pages(path: Path) -> int:
    """How many of the file's pages the page cache holds (mincore on a fresh mapping)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL("libc.so.6")
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        pages = -(-len(m) // mmap.PAGESIZE)
        vector = ctypes.create_string_buffer(pages)
        address = ctypes.addressof(ctypes.c_char.from_buffer(m))
        assert libc.mincore(address, len(m), vector) == 0
        count = sum(byte & 1 for byte in vector.raw)
        del address  # the buffer's export ends before the mapping closes
    return count


def test_weights_mapping_a_checkpoint_leave_memory_and_read_back_unchanged(tmp_path):
    """What the build does to torch's input tower while onnxruntime runs it: the pages that map
    the checkpoint file leave resident memory but stay in the page cache (no disk read when torch
    runs the tower again), while a page the process wrote to and the module's own memory stay,
    and the next pass reads the same numbers back."""
    import mmap
    import os

    from ptc.devices import page_out_weights

    path = tmp_path / "weights.bin"
    values = torch.arange(32 << 20, dtype=torch.float32)  # 128 MB
    with open(path, "wb") as handle:
        handle.write(values.numpy().tobytes())
        os.fsync(handle.fileno())  # clean pages, which a reclaim would drop from the cache
    mapped = torch.from_file(str(path), shared=False, size=values.numel(), dtype=torch.float32)
    mapped[5] = -1.0  # a private copy of that page
    values[5] = -1.0
    own = torch.randn(1 << 20)
    module = torch.nn.Module()
    module.register_parameter("mapped", torch.nn.Parameter(mapped, requires_grad=False))
    module.register_buffer("own", own.clone())
    assert torch.equal(mapped, values)  # every page read in
    held, whole_file = _resident_mb(), (32 << 22) // mmap.PAGESIZE
    assert _cached_pages(path) >= whole_file - 2  # else the check below could not fail
    page_out_weights(module)
    assert held - _resident_mb() > 120
    assert _cached_pages(path) >= whole_file - 2
    assert torch.equal(module.mapped, values) and torch.equal(module.own, own)


def test_freed_heap_memory_goes_back_to_the_system():
    """What an onnxruntime session leaves behind: many mid-size blocks freed into glibc's heap
    under a block still in use, so the heap cannot shrink, stay resident until trimmed."""
    import ctypes

    from ptc.memory import give_back_freed_memory

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype = ctypes.c_void_p
    blocks = [libc.malloc(64 << 10) for _ in range(3200)]  # 200 MB below the mmap threshold
    for block in blocks:
        ctypes.memset(block, 1, 64 << 10)
    pinned = libc.malloc(64 << 10)  # in use above them all
    for block in blocks:
        libc.free(ctypes.c_void_p(block))
    held = _resident_mb()
    give_back_freed_memory()
    assert held - _resident_mb() > 150
    libc.free(ctypes.c_void_p(pinned))
