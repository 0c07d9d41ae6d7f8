"""transformers `CLIPModel`: OpenAI CLIP, OpenCLIP-HF and MetaCLIP checkpoints.

The image embedding is `visual_projection(pooled vision output)`, a bias-free Linear
(d x width): the edit folds into it exactly as W' = (I + A) W.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ptc.media import open_images
from ptc.targets import register_hf_family
from ptc.targets.base import Batch, OnnxTower, copy_sharing, fold_into_linear_layer
from ptc.targets.hf import HFDualEncoder


def _pooled(output: Any) -> torch.Tensor:
    # transformers 5 returns an output object whose pooler_output is the projected embedding.
    return output.pooler_output if hasattr(output, "pooler_output") else output


class _ImageTower(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return _pooled(self.model.get_image_features(pixel_values=pixel_values))


class HFClip(HFDualEncoder):
    """A loaded CLIPModel with its tokenizer and image processor."""

    model_class = "CLIPModel"
    fingerprint_tag = "hf-clip"
    input_prefixes = ("vision_model.", "visual_projection.")
    text_prefixes = ("text_model.", "text_projection.")
    # peft needs the regex to match the whole module path; text-tower q/v stay frozen.
    lora_targets = {"target_modules": r".*vision_model\..*\.(q_proj|v_proj)"}
    edit_site = "the image projection (`visual_projection`) as W' = (I + A) W"

    def __init__(self, model: Any, tokenizer: Any, processor: Any, ref: str) -> None:
        super().__init__(model, tokenizer, processor, ref)
        self.embed_dim = self.edit_width = model.visual_projection.out_features
        self.max_length = model.config.text_config.max_position_embeddings

    # -- embedding ----------------------------------------------------------------------------
    def load_inputs(self, paths: list[Path]) -> Batch:
        return {
            "pixel_values": self.processor(images=open_images(paths), return_tensors="pt")[
                "pixel_values"
            ]
        }

    @torch.inference_mode()
    def embed_inputs(self, batch: Batch) -> torch.Tensor:
        return _pooled(self.model.get_image_features(**self.here(batch))).float().cpu()

    # -- edits --------------------------------------------------------------------------------
    def embed_with(self, module: Any, batch: Batch) -> torch.Tensor:
        return _pooled(module.get_image_features(pixel_values=batch["pixel_values"]))

    def with_edit(self, operator: torch.Tensor) -> HFClip:
        model = copy_sharing(self.model, [self.model.visual_projection.weight])
        fold_into_linear_layer(model.visual_projection, operator)
        return self._copy(model, "+edit")

    # -- export -------------------------------------------------------------------------------
    def onnx_towers(self) -> list[OnnxTower]:
        size = self.model.config.vision_config.image_size
        channels = self.model.config.vision_config.num_channels
        pixels = torch.zeros(2, channels, size, size)
        return [
            OnnxTower(
                "vision_model",
                _ImageTower(self.model).eval(),
                {"pixel_values": pixels},
                "image_embeds",
                {"pixel_values": {0: "batch"}},
            ),
            self.text_onnx_tower(["a photo of a thing.", "a photo."]),
        ]


register_hf_family(["clip"], HFClip.load)
