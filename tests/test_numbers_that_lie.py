"""Numbers and checkpoints that lie: the finite test against torch's own, the bank's write and
read gates, and every library ptc reads with driven into an error through the real CLI (one
line, the library named, the whole text under --debug). The damaged-checkpoint classes per
reader are cases of the bad-input corpus (tests/bad_inputs/cases.yaml)."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch

from conftest import run_ptc, write_recipe
from ptc.compiler.bank.store import Bank
from ptc.finite import NonFiniteError, first_non_finite, require_finite


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".locks" not in p.parts
    }


def _one_line(result, code: int, *fragments: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("ptc: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_finite_test_agrees_with_isfinite_element_by_element(dtype):
    generator = torch.Generator().manual_seed(0)
    huge = torch.finfo(dtype).max / 2  # finite values whose sum overflows: must still pass
    cases = {
        "plain": torch.randn(257, 33, generator=generator),
        "overflowing-sum": torch.full((64,), huge, dtype=torch.float64),
        "opposite-infinities": torch.tensor([float("inf"), float("-inf"), 1.0]),
        "one-nan": torch.randn(1000, generator=generator).index_fill_(
            0, torch.tensor([731]), float("nan")
        ),
        "empty": torch.empty(0, 4),
    }
    for name, tensor in cases.items():
        tensor = tensor.to(dtype)
        expected = (
            None
            if bool(torch.isfinite(tensor).all())
            else (name, int((~torch.isfinite(tensor)).sum()), tensor.numel())
        )
        assert first_non_finite({name: tensor}) == expected, (name, dtype)
    assert first_non_finite({"ids": torch.tensor([1, 2, 3])}) is None  # integers are always finite


def test_require_finite_names_where_and_which_tensor():
    with pytest.raises(NonFiniteError) as caught:
        require_finite(
            {"a": torch.ones(3), "b": torch.tensor([1.0, float("nan"), float("inf")])},
            "stage x",
            "hint y",
        )
    assert (
        caught.value.one_line()
        == "stage x: tensor 'b' holds NaN or Inf (2 of 3 values) (hint: hint y)"
    )
    assert caught.value.exit_code == 2


def test_the_bank_stores_nothing_non_finite(bank_copy):
    before = _files(bank_copy)
    with pytest.raises(
        NonFiniteError,
        match=r"operator for the bank entry operators/k/g/d-r1.0.safetensors: "
        r"tensor 'operator' holds NaN or Inf \(1 of 4 values\)",
    ):
        Bank(bank_copy).write_entry(
            "operators/k/g/d-r1.0.safetensors",
            {"operator": torch.tensor([[1.0, 2.0], [float("inf"), 0.0]])},
            {"kind": "operator"},
        )
    assert _files(bank_copy) == before


def test_bank_verify_reports_a_sealed_non_finite_entry(world, bank_copy):
    """An entry sealed by a ptc without the write gate (or written by hand) is reported by
    `ptc bank verify` and refused by any build that reads it."""
    bank = Bank(bank_copy)
    source = bank.descriptor("colour", "src")
    with mock.patch("ptc.compiler.bank.store.require_finite", lambda *args, **kwargs: None):
        bank.put_descriptor(
            "colour",
            "nan",
            {**source.tensors, "utd": torch.full_like(source.tensors["utd"], float("nan"))},
            {**source.meta, "id": "nan"},
        )
    result = run_ptc("bank", "verify", "--bank", bank_copy)
    assert result.returncode == 2
    problems = result.stderr.strip().splitlines()
    assert problems == [
        f"bank entry {bank_copy / 'descriptors' / 'colour' / 'nan.safetensors'}: tensor 'utd' holds "
        f"NaN or Inf ({source.tensors['utd'].numel()} of {source.tensors['utd'].numel()} values)"
    ]
    assert "1 problems" in result.stdout


# -- each library driven into an error, through the CLI --------------------------------------------
def _hf_with_config(world, folder: Path, **vision) -> Path:
    shutil.copytree(world.target, folder)
    config = json.loads((folder / "config.json").read_text())
    config["vision_config"].update(vision)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_library_error_is_one_line_and_debug_shows_the_whole_chain(world, tmp_path):
    model = _hf_with_config(world, tmp_path / "t", hidden_act="no_such_activation")
    args = [
        "eval",
        f"hf:{model}",
        "--task",
        "colour",
        "--data",
        world.tasks["colour"].parent / "test",
        "--bank",
        world.bank,
    ]
    _one_line(run_ptc(*args), 2, "transformers raised KeyError: 'no_such_activation'")
    debug = run_ptc(*args, "--debug")
    assert debug.returncode == 1 and "Traceback" in debug.stderr
    assert (
        "The above exception was the direct cause" in debug.stderr
        and "transformers" in debug.stderr
    )


def test_a_damaged_safetensors_header_is_one_line_naming_safetensors(world, tmp_path):
    folder = tmp_path / "t"
    shutil.copytree(world.target, folder)
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:16] = b"{garbage"  # the JSON header's first bytes
    weights.write_bytes(bytes(data))
    _one_line(
        run_ptc(
            "eval",
            f"hf:{folder}",
            "--task",
            "colour",
            "--data",
            world.tasks["colour"].parent / "test",
            "--bank",
            world.bank,
        ),
        2,
        f"hf:{folder}: cannot load from {folder}: safetensors raised",
    )


def _built_bank(world, tmp_path: Path) -> tuple[Path, Path]:
    """A recipe built once on a private bank (its base ONNX towers cached there)."""
    bank = tmp_path / "bank"
    shutil.copytree(world.bank, bank)
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank))
    assert run_ptc("build", recipe, "-q").returncode == 0
    return bank, recipe


def _reseal_damaged_text_tower(bank: Path) -> None:
    """The cached text tower replaced by bytes that are no graph, sealed as if written so: what
    a disk error during the export, before the seal, leaves behind."""
    from ptc.compiler.export.onnx_graph import onnx_files

    graph = next(bank.glob("exports/*/text_model.onnx"))
    graph.write_bytes(b"\x08\x07 this is no ONNX graph" * 40)
    Bank(bank).seal_export(graph.parent.name, "text_model", onnx_files(graph))


def test_onnxruntime_failing_on_a_graph_is_one_line_and_nothing_is_written(world, tmp_path):
    bank, recipe = _built_bank(world, tmp_path)
    _reseal_damaged_text_tower(bank)
    before = _files(tmp_path)
    line = _one_line(
        run_ptc("build", recipe, "--force", "-q"),
        2,
        "ONNX tower text_model: onnxruntime raised",
        "ptc bank verify",
    )
    assert "\n" not in line
    assert _files(tmp_path) == before


def test_onnx_failing_on_a_graph_is_one_line_and_nothing_is_written(world, tmp_path):
    """onnx's own parser, fed damaged bytes where the build reads a written graph's interface."""
    import onnx

    bank, recipe = _built_bank(world, tmp_path)
    before = _files(tmp_path)
    real_load = onnx.load
    with mock.patch.object(
        onnx, "load", lambda path, **kwargs: real_load(io.BytesIO(b"\x08\x07 damaged" * 40))
    ):
        _one_line(
            run_ptc("build", recipe, "--force", "-q"), 2, "ONNX tower vision_model: onnx raised"
        )
    assert _files(tmp_path) == before


def test_an_unexpected_library_error_anywhere_is_one_line_naming_the_library(world, tmp_path):
    """Outside the loaders (a bug, not bad input): exit 1, one line, the library and --debug."""
    import open_clip

    scope = {"__name__": "open_clip.factory"}  # a function that runs as a frame of open_clip's
    exec("def get_model_config(name):\n    raise RuntimeError('first\\nsecond\\nthird')", scope)
    with mock.patch.object(open_clip, "get_model_config", scope["get_model_config"]):
        result = run_ptc(
            "eval",
            "open_clip:ViT-B-32@nowhere.safetensors",
            "--task",
            "colour",
            "--data",
            world.tasks["colour"].parent / "test",
            "--bank",
            world.bank,
        )
    _one_line(
        result,
        1,
        "internal error in open_clip: RuntimeError: first [2 more line(s): --debug]",
        "hint: the open_clip config names something this open_clip cannot build; run with --debug",
    )
