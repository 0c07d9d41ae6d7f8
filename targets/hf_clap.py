"""transformers `ClapModel`: LAION CLAP checkpoints (audio <-> text).

The audio embedding is `audio_projection(pooled HTSAT output)`, a two-layer MLP whose last
Linear has a bias; `z = W h + b` folds an operator exactly as W' = (I + A) W, b' = (I + A) b.
`get_audio_features` L2-normalises its output; the towers here return the projection before
that normalisation (as CLIP's do), so the edit acts on z exactly and zero-shot normalises.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ptc.errors import OutputError
from ptc.media import read_audio
from ptc.targets import register_hf_family
from ptc.targets.base import Batch, OnnxTower, copy_sharing, fold_into_linear_layer
from ptc.targets.hf import HFDualEncoder


def _audio_embedding(model: Any, batch: Batch) -> torch.Tensor:
    return model.audio_projection(model.audio_model(**batch).pooler_output)


class _AudioTower(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return _audio_embedding(self.model, {"input_features": input_features})


class HFClap(HFDualEncoder):
    """A loaded ClapModel with its (RoBERTa) tokenizer and CLAP feature extractor."""

    model_class = "ClapModel"
    fingerprint_tag = "hf-clap"
    input_prefixes = ("audio_model.", "audio_projection.")
    text_prefixes = ("text_model.", "text_projection.")
    pipeline_tag = "zero-shot-audio-classification"
    # HTSAT's windowed attention in the audio encoder; the text tower's stays frozen.
    lora_targets = {"target_modules": r".*audio_model\..*\.attention\.self\.(query|value)"}
    edit_site = "the audio projection's last layer (`audio_projection.linear2`) as W' = (I + A) W, b' = (I + A) b"

    def __init__(self, model: Any, tokenizer: Any, processor: Any, ref: str) -> None:
        super().__init__(model, tokenizer, processor, ref)
        self.embed_dim = self.edit_width = model.audio_projection.linear2.out_features
        self.fused = bool(model.config.audio_config.enable_fusion)
        self.max_length = min(
            tokenizer.model_max_length, model.config.text_config.max_position_embeddings - 2
        )

    @staticmethod
    def text_embedding(
        model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        # get_text_features L2-normalises; the projection before it is what CLIP's towers return.
        return model.text_projection(
            model.text_model(input_ids=input_ids, attention_mask=attention_mask).pooler_output
        )

    @staticmethod
    def load_processor(folder: Path) -> Any:
        from transformers import AutoFeatureExtractor

        return AutoFeatureExtractor.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )

    def serving_preprocessing(self) -> dict[str, Any]:
        """A clip's log-mel spectrogram as the extractor computes it for an unfused model: the
        first max_samples at the model's rate, a shorter clip repeated then zero-padded to
        max_samples, a centred (reflect-padded) STFT with a periodic Hann window, the power
        spectrum through Slaney-normalised Slaney-scale mel filters, in dB."""
        extractor = self.processor
        if extractor.truncation != "rand_trunc":
            raise OutputError(
                f"{self.ref}: its feature extractor truncates by {extractor.truncation!r}, which "
                "the serving contract does not describe",
                "an unfused CLAP's extractor uses truncation: rand_trunc",
            )
        return {
            "kind": "audio",
            "input": "input_features",
            "sampling_rate": int(extractor.sampling_rate),
            "max_samples": int(extractor.nb_max_samples),
            "padding": str(extractor.padding),
            "n_fft": int(extractor.fft_window_size),
            "hop_length": int(extractor.hop_length),
            "window": "hann",
            "power": 2.0,
            "n_mels": int(extractor.feature_size),
            "f_min": float(extractor.frequency_min),
            "f_max": float(extractor.frequency_max),
            "mel_scale": "slaney",
            "mel_norm": "slaney",
            "mel_floor": 1e-10,
            "log": "dB",
            "layout": "N,1,frames,mels",
        }

    # -- embedding ----------------------------------------------------------------------------
    def load_inputs(self, paths: list[Path]) -> Batch:
        rate = self.processor.sampling_rate
        waves = [read_audio(Path(p), rate, self.processor.nb_max_samples) for p in paths]
        features = self.processor(waves, sampling_rate=rate, return_tensors="pt")
        batch = {"input_features": features["input_features"]}
        if self.fused:  # clips never exceed the window here, so is_longer is all False
            batch["is_longer"] = features["is_longer"]
        return batch

    @torch.inference_mode()
    def embed_inputs(self, batch: Batch) -> torch.Tensor:
        return _audio_embedding(self.model, self.here(batch)).float().cpu()

    # -- edits --------------------------------------------------------------------------------
    def embed_with(self, module: Any, batch: Batch) -> torch.Tensor:
        return _audio_embedding(module, batch)

    def with_edit(self, operator: torch.Tensor) -> HFClap:
        layer = self.model.audio_projection.linear2
        model = copy_sharing(self.model, [t for t in (layer.weight, layer.bias) if t is not None])
        fold_into_linear_layer(model.audio_projection.linear2, operator)
        return self._copy(model, "+edit")

    # -- export -------------------------------------------------------------------------------
    def onnx_towers(self) -> list[OnnxTower]:
        if self.fused:
            raise OutputError(
                f"{self.ref}: a fused CLAP's audio tower picks its branch from is_longer at run "
                "time, which torch's ONNX exporter cannot trace",
                "export this target with formats: [safetensors]",
            )
        rate = self.processor.sampling_rate
        clips = [
            np.zeros(rate // 2, dtype=np.float32),
            np.linspace(-0.5, 0.5, rate, dtype=np.float32),
        ]
        features = self.processor(clips, sampling_rate=rate, return_tensors="pt")["input_features"]
        return [
            OnnxTower(
                "audio_model",
                _AudioTower(self.model).eval(),
                {"input_features": features},
                "audio_embeds",
                {"input_features": {0: "batch"}},
            ),
            self.text_onnx_tower(["the sound of a thing.", "a sound."]),
        ]


register_hf_family(["clap"], HFClap.load)
