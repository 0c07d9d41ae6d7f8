"""Shipping formats: a Triton repository that matches the graphs, fp16 towers, provenance in
ONNX and safetensors metadata, and a model card with Hugging Face front matter."""

import json
import os
import re
import stat

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import yaml
from huggingface_hub import ModelCard
from safetensors import safe_open

from conftest import clip_pixels, run_ptc, write_recipe

TRITON_TYPE = {onnx.TensorProto.FLOAT: "TYPE_FP32", onnx.TensorProto.INT64: "TYPE_INT64"}


@pytest.fixture(scope="module")
def shipped(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("ship")
    recipe = write_recipe(
        folder / "recipe.yaml",
        world,
        export={
            "out": str(folder / "out"),
            "formats": ["onnx", "safetensors", "triton"],
            "precision": ["fp32", "fp16", "int8"],
            "triton": {"max_batch_size": 16},
        },
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    return folder / "out", json.loads((folder / "out" / "report.json").read_text())


def parse_pbtxt(text: str) -> dict:
    """Just enough of protobuf text format for our configs: scalars and lists of tensors."""
    config = {key: value.strip('"') for key, value in re.findall(r"^(\w+): (.+)$", text, re.M)}
    for section in ("input", "output"):
        body = re.search(rf"^{section} \[\n(.*?)\n\]", text, re.S | re.M).group(1)
        config[section] = [
            {
                "name": name,
                "data_type": dtype,
                "dims": [int(d) for d in dims.split(",") if d.strip()],
            }
            for name, dtype, dims in re.findall(
                r'name: "(\w+)"\s+data_type: (\w+)\s+dims: \[ ([^\]]*) \]', body
            )
        ]
    config["dynamic_batching"] = "dynamic_batching { }" in text
    return config


def _graph_tensors(values):
    return [
        {
            "name": v.name,
            "data_type": TRITON_TYPE[v.type.tensor_type.elem_type],
            "dims": [
                d.dim_value if d.HasField("dim_value") else -1 for d in v.type.tensor_type.shape.dim
            ][1:],
        }
        for v in values
    ]


def test_triton_configs_match_the_onnx_graphs(shipped):
    out, report = shipped
    assert sorted(report["triton_models"]) == [
        "text_model",
        "text_model_fp16",
        "text_model_int8",
        "vision_model",
        "vision_model_fp16",
        "vision_model_int8",
    ]
    for name in report["triton_models"]:
        config = parse_pbtxt((out / "triton" / name / "config.pbtxt").read_text())
        model_file = out / "triton" / name / "1" / "model.onnx"
        assert model_file.read_bytes() == (out / "onnx" / f"{name}.onnx").read_bytes()
        graph = onnx.load(str(model_file)).graph
        assert config["name"] == name and config["backend"] == "onnxruntime"
        assert config["max_batch_size"] == "16" and config["dynamic_batching"]
        assert config["input"] == _graph_tensors(graph.input)
        assert config["output"] == _graph_tensors(graph.output)
    vision = parse_pbtxt((out / "triton" / "vision_model" / "config.pbtxt").read_text())
    assert vision["input"] == [
        {"name": "pixel_values", "data_type": "TYPE_FP32", "dims": [3, 32, 32]}
    ]
    assert vision["output"] == [{"name": "image_embeds", "data_type": "TYPE_FP32", "dims": [24]}]


def test_fp16_towers_keep_fp32_io_and_agree_with_fp32(world, shipped):
    out, report = shipped
    assert report["verify"]["equivalence"]["fp16_min_cosine"] >= 0.999
    half = onnx.load(str(out / "onnx" / "vision_model_fp16.onnx"))
    assert any(t.data_type == onnx.TensorProto.FLOAT16 for t in half.graph.initializer)
    assert half.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    probes = sorted((world.tasks["colour"].parent / "test").rglob("*.png"))[:6]
    pixels = clip_pixels(probes, out / "model").numpy()
    full = ort.InferenceSession(
        str(out / "onnx" / "vision_model.onnx"), providers=["CPUExecutionProvider"]
    )
    fast = ort.InferenceSession(
        str(out / "onnx" / "vision_model_fp16.onnx"), providers=["CPUExecutionProvider"]
    )
    a, b = full.run(None, {"pixel_values": pixels})[0], fast.run(None, {"pixel_values": pixels})[0]
    assert b.dtype == np.float32
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cosine.min() >= 0.999


def test_int8_towers_quantise_the_weights_keep_the_feeds_and_agree_with_fp32(world, shipped):
    out, report = shipped
    figures = report["verify"]["equivalence"]
    assert figures["int8_min_cosine"] >= 0.99 and figures["int8_top1_agreement"] == 1.0
    quantised = onnx.load(str(out / "onnx" / "vision_model_int8.onnx"))
    assert any(t.data_type == onnx.TensorProto.INT8 for t in quantised.graph.initializer)
    assert "MatMulInteger" in {node.op_type for node in quantised.graph.node}
    sizes = report["onnx_bytes"]
    assert sizes["onnx/vision_model_int8.onnx"] < 0.6 * sizes["onnx/vision_model.onnx"]
    probes = sorted((world.tasks["colour"].parent / "test").rglob("*.png"))[:6]
    pixels = clip_pixels(probes, out / "model").numpy()
    a, b = (
        ort.InferenceSession(str(out / "onnx" / name), providers=["CPUExecutionProvider"]).run(
            None, {"pixel_values": pixels}
        )[0]
        for name in ("vision_model.onnx", "vision_model_int8.onnx")
    )
    cosine = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert b.dtype == np.float32 and cosine.min() >= 0.99
    card = (out / "README.md").read_text()
    mb = sizes["onnx/vision_model_int8.onnx"] / 1e6
    assert f"| `onnx/vision_model_int8.onnx` | int8 | {mb:.1f} MB |" in card
    assert f"int8 ONNX vs fp32 ONNX, lowest cosine: {figures['int8_min_cosine']:.6f}" in card


def test_an_int8_tower_below_its_cosine_floor_fails_the_build(world, tmp_path):
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        world,
        export={"out": str(tmp_path / "out"), "precision": ["fp32", "int8"]},
        verify={"int8_min_cosine": 0.9999999},
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 3, result.stderr
    assert "int8_min_cosine" in result.stderr and not (tmp_path / "out").exists()


def test_a_graph_onnxruntime_cannot_quantise_is_refused_in_one_line(world, tmp_path, monkeypatch):
    import onnxruntime.quantization

    def refuse(*args, **kwargs):
        raise ValueError("unsupported op in graph")

    monkeypatch.setattr(onnxruntime.quantization, "quantize_dynamic", refuse)
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        world,
        export={"out": str(tmp_path / "out"), "precision": ["fp32", "int8"]},
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 2 and not (tmp_path / "out").exists()
    assert "onnxruntime cannot quantise this graph: ValueError: unsupported op in graph" in (
        result.stderr
    )
    assert "remove int8 from export.precision" in result.stderr


def test_provenance_in_onnx_and_safetensors_metadata(shipped):
    out, report = shipped
    for name in ("vision_model", "text_model_fp16", "vision_model_int8"):
        props = {
            p.key: p.value for p in onnx.load(str(out / "onnx" / f"{name}.onnx")).metadata_props
        }
        assert (
            props["ptc_lock_hash"] == report["lock_hash"]
            and props["ptc_version"] == report["ptc_version"]
        )
        assert props["ptc_precision"] == name.rpartition("_")[2].replace("model", "fp32")
    with safe_open(str(out / "model" / "model.safetensors"), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata["format"] == "pt" and metadata["ptc_lock_hash"] == report["lock_hash"]
    assert (
        metadata["ptc_recipe_sha256"]
        == json.loads((out / "ptc.lock").read_text())["inputs"]["recipe_sha256"]
    )


def test_the_base_model_is_named_so_a_receiver_can_find_it(world, shipped):
    """A local target: its folder's name and its fingerprints (which identify the weights
    wherever they lie), never the recipe's path to it; the same in the card and every file."""
    out, report = shipped
    lock = json.loads((out / "ptc.lock").read_text())["inputs"]["target"]
    assert lock["ref"].startswith("hf:") and "/" in lock["ref"]  # a path, here absolute
    named = (
        f"{world.target.name} (input fingerprint {lock['input_fingerprint'][:16]}, "
        f"text fingerprint {lock['text_fingerprint'][:16]})"
    )
    assert f"Base model: `{named}`." in (out / "README.md").read_text()
    assert lock["ref"] not in (out / "README.md").read_text()
    graph = onnx.load(str(out / "onnx" / "vision_model.onnx"), load_external_data=False)
    assert {p.key: p.value for p in graph.metadata_props}["ptc_base_model"] == named
    with safe_open(str(out / "model" / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata()["ptc_base_model"] == named


def test_model_card_front_matter_and_loading_sections(shipped):
    out, report = shipped
    card = (out / "README.md").read_text()
    loaded = ModelCard.load(out / "README.md")  # what the Hub and huggingface_hub read
    assert (
        loaded.data.library_name == "transformers"
        and loaded.data.pipeline_tag == "zero-shot-image-classification"
    )
    # A local folder is no Hub id: base_model is left out rather than filled with a path.
    assert loaded.data.base_model is None and "base_model" not in yaml.safe_load(
        card.split("---")[1]
    )
    assert "ptc" in loaded.data.tags
    for heading in ("### transformers", "### onnxruntime", "### Triton"):
        assert heading in card
    assert report["lock_hash"] in card and "| colour | src | +0.5 |" in card


def test_provider_that_ran_is_reported(shipped):
    _, report = shipped
    equivalence = report["verify"]["equivalence"]
    assert equivalence["onnx_provider"] == "CPUExecutionProvider"
    assert equivalence["onnx_provider_requested"] in ort.get_available_providers()
    assert equivalence["onnx_provider_fell_back"] is False


def _process_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_shipped_files_are_readable_by_the_server_user_as_the_umask_allows(shipped):
    """Outputs are staged in mkdtemp/mkstemp entries, which are owner-only; an inference server
    running as another user must still read what ships (here: what open() and mkdir() give)."""
    out, _ = shipped
    mask = _process_umask()
    modes = {
        path.relative_to(out).as_posix() or ".": stat.S_IMODE(path.stat().st_mode)
        for path in [out, *out.rglob("*")]
    }
    readable = 0o444 & ~mask
    wrong = {
        name: oct(mode)
        for name, mode in modes.items()
        if mode & readable != readable
        or ((out / name).is_dir() and mode & (readable >> 2) != readable >> 2)
    }
    assert not wrong and {"ptc.lock", "report.json", "onnx"} <= {
        name.split("/")[0] for name in modes
    }


def test_atomic_writes_follow_the_umask(tmp_path):
    from ptc.files import write_bytes_atomic
    from ptc.output_dirs import staged_directory

    previous = os.umask(0o027)
    try:
        write_bytes_atomic(tmp_path / "file.json", b"{}")
        with staged_directory(tmp_path / "folder", replace=False) as staging:
            (staging / "inside").write_bytes(b"x")
            os.chmod(staging / "inside", 0o600)  # as safetensors' save_file leaves its files
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "file.json").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "folder").stat().st_mode) == 0o750
    assert stat.S_IMODE((tmp_path / "folder" / "inside").stat().st_mode) == 0o640


ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64"}


def test_report_and_card_give_every_graphs_inputs_and_outputs_as_onnxruntime_sees_them(shipped):
    out, report = shipped
    card = (out / "README.md").read_text()
    assert (
        set(report["onnx_interface"]) == set(report["onnx_files"])
        and len(report["onnx_files"]) == 6
    )
    for graph, spec in report["onnx_interface"].items():
        # independently
        session = ort.InferenceSession(str(out / graph), providers=["CPUExecutionProvider"])
        for kind, values in (("inputs", session.get_inputs()), ("outputs", session.get_outputs())):
            assert spec[kind] == [
                {"name": v.name, "dtype": ORT_TYPES[v.type], "shape": list(v.shape)} for v in values
            ]
            for v in values:
                assert (
                    f"| `{graph}` | {kind} | `{v.name}` | {ORT_TYPES[v.type]} | [{', '.join(map(str, v.shape))}] |"
                    in card
                )
    text = report["onnx_interface"]["onnx/text_model.onnx"]["inputs"]
    assert [v["name"] for v in text] == ["input_ids", "attention_mask"] and isinstance(
        text[0]["shape"][1], str
    )
    vision = report["onnx_interface"]["onnx/vision_model.onnx"]
    assert vision["inputs"][0]["shape"][1:] == [3, 32, 32] and isinstance(
        vision["inputs"][0]["shape"][0], str
    )
    assert (
        vision["outputs"][0]["name"] == "image_embeds"
        and vision["outputs"][0]["dtype"] == "float32"
    )


def test_a_target_from_the_hub_cache_is_the_cards_base_model(world, shipped, monkeypatch):
    """hf:org/name found in the local Hugging Face cache (not a folder here) is a Hub id."""
    import ptc.targets.hf as hf
    from ptc import targets
    from ptc.compiler.export.card import model_card

    monkeypatch.setattr(
        hf, "_cache_dir_for", lambda model_id: world.target if model_id == "org/tiny-clip" else None
    )
    encoder = targets.load("hf:org/tiny-clip")
    assert encoder.hub_id == "org/tiny-clip" and targets.load(f"hf:{world.target}").hub_id is None
    _, report = shipped
    card = ModelCard(model_card(encoder, "edit", report["terms"], report))
    assert card.data.base_model == "org/tiny-clip"
