"""A stand-in for tritonserver's HTTP endpoint on a machine without one: it takes a request
body exactly as tritonclient encodes it (a JSON header, then the tensors' bytes), holds every
input to the model's config.pbtxt (names, data types, dims after the batch, max_batch_size),
and runs the repository's graph with onnxruntime, as the onnxruntime backend would."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import tritonclient.http as http
from tritonclient.utils import triton_to_np_dtype

ORIGINAL_CLIENT = http.InferenceServerClient


def read_config(path: Path) -> dict:
    """The fields of a config.pbtxt that a request must match."""
    text = path.read_text()
    tensors = {}
    for section in ("input", "output"):
        block = re.search(rf"^{section} \[\n(.*?)\n\]", text, re.S | re.M).group(1)
        for name, dtype, dims in re.findall(
            r'name: "(\w+)"\s+data_type: TYPE_(\w+)\s+dims: \[ ([-\d, ]*) \]', block
        ):
            tensors[(section, name)] = (dtype, [int(d) for d in dims.split(",") if d.strip()])
    return {
        "max_batch_size": int(re.search(r"max_batch_size: (\d+)", text).group(1)),
        "inputs": {n: v for (s, n), v in tensors.items() if s == "input"},
        "outputs": {n: v for (s, n), v in tensors.items() if s == "output"},
    }


class Result:
    def __init__(self, outputs: dict[str, np.ndarray]) -> None:
        self.outputs = outputs

    def as_numpy(self, name: str) -> np.ndarray:
        return self.outputs[name]


class FakeTriton:
    """What `http.InferenceServerClient(url)` talks to, with `repository` behind it."""

    def __init__(self, repository: Path) -> None:
        self.repository = Path(repository)

    def infer(self, model_name: str, inputs: list, outputs=None) -> Result:
        body, json_size = ORIGINAL_CLIENT.generate_request_body(inputs, outputs)
        header = json.loads(body[:json_size] if json_size else body)
        config = read_config(self.repository / model_name / "config.pbtxt")
        arrays, offset = {}, 0
        for spec in header["inputs"]:
            dtype, dims = config["inputs"][spec["name"]]  # KeyError: an input the model lacks
            assert spec["datatype"] == dtype, (spec["name"], spec["datatype"], dtype)
            shape = spec["shape"]
            assert 1 <= shape[0] <= config["max_batch_size"], shape
            assert len(shape) - 1 == len(dims) and all(
                d == -1 or d == s for d, s in zip(dims, shape[1:])
            ), (spec["name"], shape, dims)
            size = spec["parameters"]["binary_data_size"]
            data = body[json_size + offset : json_size + offset + size]
            arrays[spec["name"]] = np.frombuffer(data, triton_to_np_dtype(dtype)).reshape(shape)
            offset += size
        assert sorted(arrays) == sorted(config["inputs"]), (sorted(arrays), config["inputs"])
        session = ort.InferenceSession(
            str(self.repository / model_name / "1" / "model.onnx"),
            providers=["CPUExecutionProvider"],
        )
        names = [o.name for o in session.get_outputs()]
        assert sorted(names) == sorted(config["outputs"])
        return Result(dict(zip(names, session.run(None, arrays))))


def request_inputs(arrays: dict[str, np.ndarray]) -> list:
    """tritonclient's inputs for named arrays, as the README's client builds them."""
    inputs = []
    for name, array in arrays.items():
        tensor = http.InferInput(name, list(array.shape), http.np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs
