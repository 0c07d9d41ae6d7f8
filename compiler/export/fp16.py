"""A graph's float16 variant: weights and activations in float16, inputs and outputs
kept float32, so it takes the same feeds."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from ptc.compiler.export.onnx_graph import save_onnx, set_metadata

if TYPE_CHECKING:
    import onnx


def fp16_variant(source: Path, target: Path, provenance: dict[str, str]) -> None:
    """Weights and activations in float16, inputs and outputs kept float32 (same feeds)."""
    import onnx
    from onnxconverter_common import float16

    with warnings.catch_warnings():  # "-3.4e38 truncated to -1e4": attention masks, harmless
        warnings.simplefilter("ignore")
        model = float16.convert_float_to_float16(onnx.load(str(source)), keep_io_types=True)
    _retarget_float_casts(model)
    set_metadata(model, {**provenance, "ptc_precision": "fp16"})
    save_onnx(model, target)


def _retarget_float_casts(model: onnx.ModelProto) -> None:
    """The converter re-types a Cast-to-float's output as float16 but leaves the node's `to`
    at float (onnxconverter-common issue 320), which onnxruntime rejects at load. Such casts
    come from integer inputs (SigLIP2's patch grid): point them at float16 as declared."""
    from onnx import TensorProto

    declared = {info.name: info.type.tensor_type.elem_type for info in model.graph.value_info}
    for node in model.graph.node:
        if node.op_type != "Cast" or declared.get(node.output[0]) != TensorProto.FLOAT16:
            continue
        for attribute in node.attribute:
            if attribute.name == "to" and attribute.i == TensorProto.FLOAT:
                attribute.i = TensorProto.FLOAT16
