"""ONNX graphs as files: exporting a tower (torch.export, external data), the
provenance in its metadata, saving and copying a graph with its data file, and the
interface (input and output names, types, shapes) a deployer feeds."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from ptc.errors import OutputError
from ptc.targets.base import OnnxTower

if TYPE_CHECKING:  # onnx loads where a graph is written, not with the build
    import onnx

ONNX_OPSET = 18


@contextmanager
def _without_input_asserts() -> Iterator[None]:
    """transformers guards inputs with torch._check asserts (SigLIP2's spatial shapes) that
    trace into aten._is_all_true, which has no ONNX translation. They validate inputs and
    compute nothing, so the export leaves them out (transformers' own switch); the graph is
    checked against torch numerically right after."""
    previous = os.environ.get("TRANSFORMERS_DISABLE_TORCH_CHECK")
    os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("TRANSFORMERS_DISABLE_TORCH_CHECK")
        else:
            os.environ["TRANSFORMERS_DISABLE_TORCH_CHECK"] = previous


@contextmanager
def _quiet_exporter() -> Iterator[None]:
    """The exporter's optimizer logs a warning per op it leaves unfolded ("Skipping constant
    folding for op Split ..."): notes for its developers, not for someone building a model.
    Errors still show; --debug shows the exporter's traceback."""
    import logging

    loggers = [logging.getLogger(name) for name in ("onnxscript", "onnx_ir", "torch.onnx")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def export_onnx(tower: OnnxTower, path: Path) -> None:
    """torch.export-based ONNX export (torch's default), dynamic axes as named, written once:
    stack traces dropped in memory, the tensors as external data beside the graph."""
    dims: dict[str, torch.export.Dim] = {}
    dynamic_shapes = {
        name: {
            axis: dims.setdefault(label, torch.export.Dim(label)) for axis, label in axes.items()
        }
        for name, axes in tower.dynamic_axes.items()
    }
    shapes: dict[str, dict[int, torch.export.Dim] | None] = {
        name: dynamic_shapes.get(name) for name in tower.example_inputs
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with (
        warnings.catch_warnings(),
        torch.inference_mode(False),
        torch.no_grad(),
        _without_input_asserts(),
        _quiet_exporter(),
    ):
        warnings.simplefilter("ignore")
        try:
            program = torch.onnx.export(
                tower.module,
                tuple(tower.example_inputs.values()),
                None,
                input_names=list(tower.example_inputs),
                output_names=[tower.output_name],
                dynamic_shapes=shapes,
                dynamo=True,
                opset_version=ONNX_OPSET,
                verbose=False,
            )
        except Exception as exc:
            raise OutputError(
                f"ONNX export of {tower.name} failed: {type(exc).__name__}: {exc}".split("\n")[0],
                "run with --debug for the exporter's traceback",
            ) from exc
    if program is None:  # the dynamo exporter returns a program whenever it does not raise
        raise OutputError(f"ONNX export of {tower.name} returned no program")
    _drop_stack_traces(program.model)
    program.save(str(path), external_data=True)  # tensors beside the graph: see tower_cache.py
    _let_go_of_parameters(program.model.graph)


def _let_go_of_parameters(graph: Any) -> None:
    """onnxscript's rewrite rules are module-level objects that keep the last graph they matched,
    whose values wrap the exported module's own parameters (its unused ones too): a model let go
    after its export stayed in memory whole (torch 2.14). Once saved, the graph needs no data."""
    # The inputs' reference counter still holds the unused parameters the exporter removed.
    for value in [*graph.initializers.values(), *getattr(graph.inputs, "_ref_counter", ())]:
        value.const_value = None
    graph.initializers.clear()


def set_metadata(model: onnx.ModelProto, provenance: dict[str, str]) -> None:
    """Provenance in the graph's metadata_props (what `onnx.load(...).metadata_props` shows)."""
    existing = {p.key: p for p in model.metadata_props}
    for key, value in provenance.items():
        entry = existing.get(key) or model.metadata_props.add()
        entry.key, entry.value = key, str(value)


def _drop_stack_traces(model: Any) -> None:
    """The exporter records each node's Python stack trace, with the absolute paths of the
    files that traced it: the same model exported from another checkout or virtualenv would
    differ in bytes. The trace is a debugging aid, not part of the graph (an onnx_ir model)."""
    nodes = [
        *model.graph.all_nodes(),
        *(node for function in model.functions.values() for node in function),
    ]
    for node in nodes:
        node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)


def save_onnx(model: onnx.ModelProto, path: Path) -> None:
    """Save a graph with every tensor over 1 KiB in `<name>.data` beside it, as export_onnx does."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=f"{path.name}.data",
        size_threshold=1024,
    )


def onnx_files(path: Path) -> list[Path]:
    """The graph and, where it has one, its external data file."""
    data = path.with_name(f"{path.name}.data")
    return [path, data] if data.is_file() else [path]


class TensorSpec(TypedDict):
    """One input or output of a graph: a fixed axis is an int, a dynamic one its name."""

    name: str
    dtype: str
    shape: list[int | str]


class Interface(TypedDict):
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


def interface(path: Path) -> Interface:
    """What a deployer feeds a graph and gets back, read off the graph itself: each input's and
    output's name, dtype and shape (an int for a fixed axis, the axis's name for a dynamic one)."""
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    graph = onnx.load(str(path), load_external_data=False).graph

    def described(values: Iterable[onnx.ValueInfoProto]) -> list[TensorSpec]:
        return [
            {
                "name": v.name,
                "dtype": str(tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)),
                "shape": [
                    d.dim_value if d.HasField("dim_value") else d.dim_param
                    for d in v.type.tensor_type.shape.dim
                ],
            }
            for v in values
        ]

    return {"inputs": described(graph.input), "outputs": described(graph.output)}


def copy_onnx(source: Path, folder: Path, name: str) -> Path:
    """`source` (and its external data, under the name the graph records) copied into `folder`
    as `name`; for Triton's `<model>/1/model.onnx` layout."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in onnx_files(source):
        shutil.copyfile(file, folder / (name if file == source else file.name))
    return folder / name
