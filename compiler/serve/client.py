"""An ONNX-only client of a build output: the contract's preprocessing, its tokenizer and
onnxruntime, nothing else (numpy, PIL, tokenizers; soundfile and scipy for audio). What a
serving host runs, and what the build runs on its check inputs before anything ships."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from ptc.compiler.serve.contract import Contract, contract_folder, read_contract
from ptc.compiler.serve.preprocess import Arrays, input_arrays


class OnnxClient:
    """The towers of `folder` (a build output or its onnx/), run as the contract says. Both
    embeddings come back unnormalised, as the graphs return them."""

    def __init__(self, folder: Path, providers: list[str] | None = None) -> None:
        self.folder = contract_folder(Path(folder))
        self.contract: Contract = read_contract(self.folder)
        self.providers = providers or ["CPUExecutionProvider"]

    def _session(self, graph: str) -> Any:
        import onnxruntime as ort

        return ort.InferenceSession(str(self.folder / graph), providers=self.providers)

    @cached_property
    def input_session(self) -> Any:
        return self._session(self.contract["input"]["graph"])

    @cached_property
    def text_session(self) -> Any:
        return self._session(self.contract["text"]["graph"])

    @cached_property
    def tokenizer(self) -> Any:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(self.folder / self.contract["text"]["tokenizer"]))

    # -- inputs -----------------------------------------------------------------------------------
    def input_arrays(self, paths: list[Path]) -> Arrays:
        return input_arrays(paths, self.contract["input"]["preprocessing"])

    def embed_arrays(self, arrays: Arrays) -> np.ndarray:
        return np.asarray(self.input_session.run([self.contract["input"]["output"]], arrays)[0])

    def embed_inputs(self, paths: list[Path], batch_size: int = 64) -> np.ndarray:
        """Unnormalised embeddings of image (or audio) files, in batches."""
        chunks = [
            self.embed_arrays(self.input_arrays(paths[i : i + batch_size]))
            for i in range(0, len(paths), batch_size)
        ]
        return np.concatenate(chunks) if chunks else np.zeros((0, 0), dtype=np.float32)

    # -- text -------------------------------------------------------------------------------------
    def token_arrays(self, prompts: list[str]) -> Arrays:
        """The text graph's inputs: ids (and attention mask where the graph takes one), truncated
        and padded as tokenizer.json says."""
        encodings = self.tokenizer.encode_batch(prompts)
        columns = {
            "input_ids": np.asarray([e.ids for e in encodings], dtype=np.int64),
            "attention_mask": np.asarray([e.attention_mask for e in encodings], dtype=np.int64),
        }
        return {name: columns[name] for name in self.contract["text"]["inputs"]}

    def embed_texts(self, prompts: list[str], batch_size: int = 256) -> np.ndarray:
        """Unnormalised text embeddings of `prompts`, in batches."""
        output = self.contract["text"]["output"]
        chunks = [
            np.asarray(
                self.text_session.run([output], self.token_arrays(prompts[i : i + batch_size]))[0]
            )
            for i in range(0, len(prompts), batch_size)
        ]
        return np.concatenate(chunks)


def normalised(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    return rows / np.linalg.norm(rows, axis=-1, keepdims=True)
