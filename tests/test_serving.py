"""An ONNX-only client (onnxruntime, numpy, PIL, tokenizers; never torch) follows an output's
serving contract to the family's own embeddings and predictions, for every family."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from PIL import Image

from conftest import FAMILIES, REPO, run_card_snippets, run_ptc
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.export.int8 import int8_variant
from ptc.compiler.export.onnx_graph import export_onnx
from ptc.compiler.export.serving import (
    LONG_PROMPT,
    preprocess_difference,
    preprocess_tolerance,
    write_contract,
)
from ptc.compiler.export.triton import write_triton_model
from ptc.compiler.serve.client import OnnxClient
from ptc.compiler.serve.preprocess import input_arrays
from ptc.compiler.tasks.labelled import labelled_files
from triton_fake import FakeTriton, request_inputs

# The client in a fresh interpreter: embeddings of the files and prompts given, written as .npy
# (no pickle), and whether anything imported torch on the way.
CLIENT = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    import numpy as np
    from ptc.compiler.serve.client import OnnxClient

    folder, request, out = map(Path, sys.argv[1:4])
    asked = json.loads(request.read_text())
    client = OnnxClient(folder)
    np.save(out / "inputs.npy", client.embed_inputs([Path(p) for p in asked["paths"]]))
    np.save(out / "texts.npy", client.embed_texts(asked["prompts"]))
    (out / "torch.txt").write_text(str("torch" in sys.modules))
    """
)


def _held_out(request, modality: str) -> tuple[list[Path], list[str], int]:
    """The world's held-out files of one task, its class-major prompts and its class count."""
    world = request.getfixturevalue("audio_world" if modality == "audio" else "world")
    name = "pitch" if modality == "audio" else "colour"
    task = Bank(world.bank).task(name)
    pairs = labelled_files(world.tasks[name].parent / "test", task.classes)
    return [p for p, _ in pairs], list(task.prompts), len(task.classes)


def _top1(inputs: np.ndarray, texts: np.ndarray, n_classes: int) -> np.ndarray:
    def unit(rows: np.ndarray) -> np.ndarray:
        rows = rows.astype(np.float64)
        return rows / np.linalg.norm(rows, axis=-1, keepdims=True)

    classes = unit(unit(texts).reshape(n_classes, -1, texts.shape[-1]).mean(axis=1))
    return (unit(inputs) @ classes.T).argmax(axis=1)


def _serving_folder(encoder, folder: Path) -> Path:
    towers = encoder.onnx_towers()
    for tower in towers:
        export_onnx(tower, folder / f"{tower.name}.onnx")
    write_contract(encoder.serving_spec(), towers, folder)
    return folder


# EVA02's tiny tower takes 40 s to export on 2 cores: its preprocessing is open_clip's (held
# below) and test_families' EVA02 build holds its contract, as every build does.
@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"open_clip-eva02"}))
def test_an_onnx_only_client_gives_the_familys_embeddings_and_predictions(
    family, tmp_path, request
):
    build, scheme, modality = (*FAMILIES[family], "image")[:3]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=4)))
    folder = _serving_folder(encoder, tmp_path / "onnx")
    paths, prompts, n_classes = _held_out(request, modality)
    paths = paths[::2]  # every class, half the files
    prompts_asked = [*prompts, LONG_PROMPT, "A PHOTO, of   a blue-ish  circle!"]
    (tmp_path / "request.json").write_text(
        json.dumps({"paths": [str(p) for p in paths], "prompts": prompts_asked})
    )
    subprocess.run(
        [sys.executable, "-c", CLIENT, str(folder), str(tmp_path / "request.json"), str(tmp_path)],
        check=True,
        cwd=REPO,
    )
    assert (tmp_path / "torch.txt").read_text() == "False"
    inputs, texts = np.load(tmp_path / "inputs.npy"), np.load(tmp_path / "texts.npy")
    expected_inputs = encoder.embed_inputs(encoder.load_inputs(paths)).numpy()
    expected_texts = encoder.embed_prompts(prompts_asked).numpy()
    assert np.abs(inputs - expected_inputs).max() <= 1e-5
    text_gaps = np.abs(texts - expected_texts).max(axis=1)
    assert text_gaps.max() <= 1e-5, [prompts_asked[i] for i in np.flatnonzero(text_gaps > 1e-5)]
    n = len(prompts)
    predictions = _top1(inputs, texts[:n], n_classes)
    assert np.array_equal(predictions, _top1(expected_inputs, expected_texts[:n], n_classes))
    # Triton, the deployer's way: the contract's arrays as tritonclient sends them, held to
    # each model's config.pbtxt and run through the repository's graph
    server, contract = FakeTriton(tmp_path / "triton"), OnnxClient(folder)
    for graph in sorted(folder.glob("*.onnx")):
        write_triton_model(server.repository, graph.stem, graph, max_batch_size=8)
    served = {
        "input": server.infer(
            contract.contract["input"]["graph"].removesuffix(".onnx"),
            request_inputs(contract.input_arrays(paths[:4])),
        ).as_numpy(contract.contract["input"]["output"]),
        "text": server.infer(
            contract.contract["text"]["graph"].removesuffix(".onnx"),
            request_inputs(contract.token_arrays(prompts_asked[-2:])),
        ).as_numpy(contract.contract["text"]["output"]),
    }
    assert np.abs(served["input"] - expected_inputs[:4]).max() <= 1e-5
    assert np.abs(served["text"] - expected_texts[-2:]).max() <= 1e-5
    # int8 for CPU serving: every family's graphs quantise and take the same feeds (the build
    # holds each output to verify.int8_min_cosine; these random tiny weights are no measure of
    # it: the lowest, SigLIP's text tower, gives 0.88)
    feeds = {"input": contract.input_arrays(paths[:4]), "text": contract.token_arrays(prompts)}
    for side, arrays in feeds.items():
        graph = folder / contract.contract[side]["graph"]
        int8_variant(graph, graph.with_name(f"{graph.stem}_int8.onnx"), {})
        full, quantised = (
            ort.InferenceSession(str(g), providers=["CPUExecutionProvider"]).run(None, arrays)[0]
            for g in (graph, graph.with_name(f"{graph.stem}_int8.onnx"))
        )
        cosine = (full * quantised).sum(1) / np.linalg.norm(full, axis=1)
        assert (cosine / np.linalg.norm(quantised, axis=1)).min() > 0.8, side


def _smooth_images(folder: Path) -> list[Path]:
    """Images of several sizes, smooth as photographs are (noise would test only the resize
    filters' far tails), one already at the tiny models' 32 x 32."""
    rng, paths = np.random.default_rng(0), []
    for width, height in [(50, 37), (33, 35), (200, 120), (20, 25), (64, 64), (32, 32)]:
        y, x = np.mgrid[0:height, 0:width]
        phase = rng.uniform(0, 6, size=3)
        pixels = np.stack([127 + 120 * np.sin(x / 7 + y / 11 + p) for p in phase], axis=-1)
        path = folder / f"{width}x{height}.png"
        Image.fromarray(pixels.astype(np.uint8)).save(path)
        paths.append(path)
    return paths


@pytest.mark.parametrize(
    "preprocess",
    [
        {"resize_mode": "longest", "fill_color": 0},
        {"resize_mode": "longest", "fill_color": 128},
        {"resize_mode": "shortest", "size": [32, 24]},
    ],
)
def test_open_clips_keep_ratio_transforms_preprocess_identically(preprocess, tmp_path):
    """open_clip's ResizeKeepRatio and CenterCropOrPad, described as data: PIL on both sides."""
    from ptc.lab.tiny import openclip

    folder = openclip.build_tiny(tmp_path / "m", width=32, embed_dim=20, seed=2)
    config = json.loads((folder / "open_clip_config.json").read_text())
    config["preprocess_cfg"].update(preprocess)
    (folder / "open_clip_config.json").write_text(json.dumps(config))
    encoder = targets.load(f"open_clip:local-dir:{folder}")
    paths = _smooth_images(tmp_path)
    spec = encoder.serving_spec().preprocessing
    assert "keep_ratio" in spec["resize"]
    largest, identical = preprocess_difference(
        input_arrays(paths, spec), encoder.load_inputs(paths)
    )
    assert largest <= 1e-6 and identical == len(paths)


@pytest.mark.parametrize("family", sorted(name for name, row in FAMILIES.items() if len(row) == 2))
def test_images_of_any_size_preprocess_as_the_family_does_to_two_intensity_levels(family, tmp_path):
    """PIL resizes where the families' processors use torchvision: the two round a few pixels
    apart, by at most two levels (the build holds every output to it)."""
    build, scheme = FAMILIES[family]
    encoder = targets.load(scheme.format(build(tmp_path / "m", seed=4)))
    paths = _smooth_images(tmp_path)
    spec = encoder.serving_spec().preprocessing
    largest, identical = preprocess_difference(
        input_arrays(paths, spec), encoder.load_inputs(paths)
    )
    assert largest <= preprocess_tolerance(spec, 1e-5), (largest, identical)
    assert identical >= 1  # the image already at the model's size passes through unchanged


def test_ptc_eval_with_the_onnx_runtime_gives_the_torch_paths_accuracy_without_torch(
    world, built, tmp_path
):
    out, _ = built
    data = world.tasks["colour"].parent / "test"
    args = ["eval", str(out), "--task", "colour", "--data", str(data), "--bank", str(world.bank)]
    script = (
        "import sys\n"
        "from ptc.compiler.cli.main import main\n"
        "try:\n    main(sys.argv[1:], standalone_mode=False)\n"
        "finally:\n    print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
    )
    onnx = subprocess.run(
        [sys.executable, "-c", script, *args, "--runtime", "onnx", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert onnx.returncode == 0, onnx.stderr
    assert "torch imported: False" in onnx.stderr
    torch_run = run_ptc(*args, "--json")
    assert torch_run.returncode == 0, torch_run.stderr
    by_onnx, by_torch = json.loads(onnx.stdout), json.loads(torch_run.stdout)
    assert by_onnx["runtime"] == "onnx" and by_onnx["total"] == by_torch["total"] > 0
    assert by_onnx["correct"] == by_torch["correct"]
    assert by_onnx["accuracy"] == pytest.approx(by_torch["accuracy"], abs=1e-6)
    assert by_onnx["per_class"] == pytest.approx(by_torch["per_class"], abs=1e-6)


def test_a_build_ships_the_contract_and_reports_how_close_it_came(built):
    out, _ = built
    report = json.loads((out / "report.json").read_text())
    assert report["serving_files"] == ["onnx/serving.json", "onnx/tokenizer.json"]
    figures = report["verify"]["equivalence"]
    assert figures["serving_text_max_abs_diff"] <= 1e-5
    assert figures["serving_preprocess_max_abs_diff"] <= 1e-5  # the world's images: model size
    assert (
        figures["serving_inputs_identical"]
        == f"{figures['check_inputs']}/{figures['check_inputs']}"
    )
    identical, checked = figures["serving_prompts_identical"].split("/")
    assert identical == checked and int(checked) > 1  # the recipe's prompts and the long one
    contract = json.loads((out / "onnx" / "serving.json").read_text())
    config = json.loads((out / "model" / "config.json").read_text())
    assert contract["text"]["context_length"] == config["text_config"]["max_position_embeddings"]


def test_a_contract_whose_tokenizer_differs_fails_the_build_naming_a_prompt(
    world, tmp_path, monkeypatch
):
    """Two words' ids swapped in the contract's tokenizer.json: every prompt with either word
    would reach the text graph as another prompt."""
    from conftest import write_recipe
    from ptc.targets.hf_clip import HFClip

    described = HFClip.serving_spec

    def swapped_words(self):
        spec = described(self)
        document = json.loads(spec.tokenizer_json)
        vocab = document["model"]["vocab"]
        vocab["red</w>"], vocab["blue</w>"] = vocab["blue</w>"], vocab["red</w>"]
        return dataclasses.replace(spec, tokenizer_json=json.dumps(document))

    monkeypatch.setattr(HFClip, "serving_spec", swapped_words)
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    result = run_ptc("build", recipe)
    assert result.returncode != 0
    assert "serving_prompts_identical" in result.stderr
    assert "red" in result.stderr or "blue" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_warm_rebuild_checks_the_served_text_against_the_cached_prompts(
    built, world, tmp_path, monkeypatch
):
    """The embed stage's prompt embeddings are the serving and reload checks' reference: torch's
    text tower runs only the reloaded checkpoint's few prompts and the prompt past the context."""
    from conftest import write_recipe
    from ptc.compiler.build.outputs import RELOAD_CHECKS
    from ptc.compiler.export.serving import LONG_PROMPT
    from ptc.targets.hf import HFDualEncoder

    embedded: list[str] = []
    own = HFDualEncoder.embed_prompts

    def counted(self, prompts):
        embedded.extend(prompts)
        return own(self, prompts)

    monkeypatch.setattr(HFDualEncoder, "embed_prompts", counted)
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    assert len(embedded) == RELOAD_CHECKS + 1 and LONG_PROMPT in embedded
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["verify"]["equivalence"]["serving_text_max_abs_diff"] <= 1e-5


def test_a_contract_that_misdescribes_the_preprocessing_fails_the_build(
    world, tmp_path, monkeypatch
):
    from conftest import write_recipe
    from ptc.targets.hf_clip import HFClip

    described = HFClip.serving_preprocessing

    def wrong_mean(self):
        record = described(self)
        return {**record, "mean": [0.5, 0.5, 0.5]}

    monkeypatch.setattr(HFClip, "serving_preprocessing", wrong_mean)
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    result = run_ptc("build", recipe)
    assert result.returncode != 0
    assert "serving_preprocess_max_abs_diff" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_folder_without_a_contract_is_one_clear_line(world, tmp_path):
    data = world.tasks["colour"].parent / "test"
    result = run_ptc(
        "eval",
        tmp_path,
        "--runtime",
        "onnx",
        "--task",
        "colour",
        "--data",
        data,
        "--bank",
        world.bank,
    )
    assert result.returncode == 2
    assert f"{tmp_path}: no serving.json" in result.stderr


CARD_PROMPTS = ["a photo of a cat", "a photo of a dog"]  # the prompts the card's snippets embed


def test_every_python_snippet_in_the_card_runs_as_written(built):
    out, _ = built
    expected = targets.load(f"hf:{out / 'model'}").embed_prompts(CARD_PROMPTS).numpy()
    assert run_card_snippets(out, expected) == 3  # transformers, onnxruntime, ptc's client
