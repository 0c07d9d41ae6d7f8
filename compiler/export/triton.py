"""A Triton model repository beside the graphs: per graph, `config.pbtxt` read off the
graph itself and the graph as `1/model.onnx`."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from ptc.compiler.export.onnx_graph import copy_onnx

if TYPE_CHECKING:
    import onnx

TRITON_TYPES = {1: "TYPE_FP32", 10: "TYPE_FP16", 7: "TYPE_INT64", 6: "TYPE_INT32", 9: "TYPE_BOOL"}


def _triton_tensors(values: Iterable[onnx.ValueInfoProto]) -> str:
    blocks = []
    for value in values:
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tensor.shape.dim][
            1:
        ]  # batch is implicit
        blocks.append(
            f'  {{\n    name: "{value.name}"\n    data_type: {TRITON_TYPES[tensor.elem_type]}\n'
            f"    dims: [ {', '.join(map(str, dims))} ]\n  }}"
        )
    return ",\n".join(blocks)


def write_triton_model(repository: Path, name: str, onnx_path: Path, max_batch_size: int) -> Path:
    """`<repository>/<name>/config.pbtxt` and `<name>/1/model.onnx`, read off the ONNX graph
    itself so that names, types and dims cannot drift from it."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    folder = repository / name
    copy_onnx(onnx_path, folder / "1", "model.onnx")
    config = (
        f'name: "{name}"\nbackend: "onnxruntime"\nmax_batch_size: {max_batch_size}\n'
        f"input [\n{_triton_tensors(graph.input)}\n]\noutput [\n{_triton_tensors(graph.output)}\n]\n"
        "dynamic_batching { }\n"
    )
    (folder / "config.pbtxt").write_text(config)
    return folder
