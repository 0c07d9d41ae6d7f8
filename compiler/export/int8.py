"""A graph's int8 variant for CPU serving: weights quantised to int8 by onnxruntime's dynamic
quantisation (activations quantised on the fly), inputs and outputs unchanged, so it takes
the same feeds."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from ptc.compiler.export.onnx_graph import save_onnx, set_metadata
from ptc.errors import OutputError


def int8_variant(source: Path, target: Path, provenance: dict[str, str]) -> None:
    """MatMul and Conv weights as int8 (onnxruntime's quantize_dynamic), the rest as it was."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # its advice to pre-process the graph is for calibrated modes
    try:
        with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
            quantised = Path(scratch) / target.name
            quantize_dynamic(
                source,
                quantised,
                weight_type=QuantType.QInt8,
                use_external_data_format=True,
            )
            model = onnx.load(str(quantised))
    except Exception as exc:
        raise OutputError(
            f"int8 export of {source.name}: onnxruntime cannot quantise this graph: "
            f"{type(exc).__name__}: {exc}".split("\n")[0],
            "remove int8 from export.precision for this target",
        ) from exc
    finally:
        root.setLevel(level)
    set_metadata(model, {**provenance, "ptc_precision": "int8"})
    save_onnx(model, target)
