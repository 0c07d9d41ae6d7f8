"""transformers `SiglipModel` and `Siglip2Model`: SigLIP and SigLIP2 (NaFlex) checkpoints.

Their image embedding leaves an attention-pooling head through a residual sum,

    z = r + W2 u + b2,    u = act(W1 LN(r) + b1),

with no projection after it, so no d x d operator folds into the weights. The edit goes into
the head MLP's last affine instead: W2' = W2 + dW2, b2' = b2 + db2 moves z by exactly
dW2 u + db2 = E [u; 1], so the regressor rows are R = [u; 1] and E = [dW2 db2] (d x (p + 1)),
solved by the same two-filter formula (see compiler/method/ridge.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from typing_extensions import Self

from ptc.media import open_images
from ptc.targets import register_hf_family
from ptc.targets.base import Batch, OnnxTower, copy_sharing
from ptc.targets.hf import HFDualEncoder
from ptc.targets.serving import image_record, interpolation_name


class _ImageTower(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def features(self, **batch: torch.Tensor) -> torch.Tensor:
        return self.model.get_image_features(**batch).pooler_output


class _ImageTowerSiglip(_ImageTower):
    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.features(pixel_values=pixel_values)


class _ImageTowerSiglip2(_ImageTower):
    def forward(
        self,
        pixel_values: torch.Tensor,
        pixel_attention_mask: torch.Tensor,
        spatial_shapes: torch.Tensor,
    ) -> torch.Tensor:
        return self.features(
            pixel_values=pixel_values,
            pixel_attention_mask=pixel_attention_mask,
            spatial_shapes=spatial_shapes,
        )


class HFSiglip(HFDualEncoder):
    """A loaded SiglipModel with its (sentencepiece) tokenizer and image processor."""

    model_class = "SiglipModel"
    fingerprint_tag = "hf-siglip"
    input_prefixes = ("vision_model.",)
    text_prefixes = ("text_model.",)
    # The encoder's attention; the pooling head's nn.MultiheadAttention has no q_proj/v_proj.
    lora_targets = {"target_modules": r".*vision_model\.encoder\..*\.(q_proj|v_proj)"}
    edit_site = (
        "the pooling head's MLP output layer (`vision_model.head.mlp.fc2`) as W2' = W2 + dW2, "
        "b2' = b2 + db2"
    )
    image_tower: type[_ImageTower] = _ImageTowerSiglip
    edit_acts_on_embeddings = False  # R = [u; 1], the head MLP's hidden rows
    # SigLIP was trained on prompts padded to the full context: zero-shot pads the same way.
    pad_to_max_length = True
    contrastive_loss = "sigmoid"

    def __init__(self, model: Any, tokenizer: Any, processor: Any, ref: str) -> None:
        super().__init__(model, tokenizer, processor, ref)
        head = model.vision_model.head.mlp.fc2
        self.embed_dim = head.out_features
        self.edit_width = head.in_features + 1
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
        return self.model.get_image_features(**self.here(batch)).pooler_output.float().cpu()

    @torch.inference_mode()
    def embed_for_edit(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        captured = []
        hook = self.model.vision_model.head.mlp.fc2.register_forward_hook(
            lambda _module, args, _out: captured.append(args[0])
        )
        try:
            z = self.model.get_image_features(**self.here(batch)).pooler_output.float().cpu()
        finally:
            hook.remove()
        u = captured[0][:, 0].float().cpu()  # the head runs on its one probe token
        return z, torch.cat([u, torch.ones(len(u), 1)], dim=1)

    # -- edits --------------------------------------------------------------------------------
    def embed_with(self, module: Any, batch: Batch) -> torch.Tensor:
        return module.get_image_features(**batch).pooler_output

    def with_edit(self, edit: torch.Tensor) -> Self:
        if tuple(edit.shape) != (self.embed_dim, self.edit_width):
            raise ValueError(
                f"head edit is {tuple(edit.shape)}, the head takes {(self.embed_dim, self.edit_width)}"
            )
        head = self.model.vision_model.head.mlp.fc2
        model = copy_sharing(self.model, [head.weight, head.bias])
        fc2 = model.vision_model.head.mlp.fc2
        edit = edit.double()
        fc2.weight.data.copy_((fc2.weight.data.double() + edit[:, :-1]).to(fc2.weight.dtype))
        fc2.bias.data.copy_((fc2.bias.data.double() + edit[:, -1]).to(fc2.bias.dtype))
        return self._copy(model, "+edit")

    # -- export -------------------------------------------------------------------------------
    def example_batch(self) -> Batch:
        size = self.model.config.vision_config.image_size
        return {
            "pixel_values": torch.zeros(2, self.model.config.vision_config.num_channels, size, size)
        }

    def onnx_towers(self) -> list[OnnxTower]:
        batch = self.example_batch()
        return [
            OnnxTower(
                "vision_model",
                self.image_tower(self.model).eval(),
                batch,
                "image_embeds",
                {name: {0: "batch"} for name in batch},
            ),
            self.text_onnx_tower(["a photo of a thing.", "a photo."]),
        ]


class HFSiglip2(HFSiglip):
    """A loaded Siglip2Model: NaFlex inputs (patches, their mask and each image's patch grid),
    a Gemma tokenizer, the same residual pooling head."""

    model_class = "Siglip2Model"
    fingerprint_tag = "hf-siglip2"
    image_tower = _ImageTowerSiglip2

    def load_inputs(self, paths: list[Path]) -> Batch:
        out = self.processor(images=open_images(paths), return_tensors="pt")
        return {
            name: out[name] for name in ("pixel_values", "pixel_attention_mask", "spatial_shapes")
        }

    def serving_preprocessing(self) -> dict[str, Any]:
        """NaFlex: each image resized (aspect kept) to the largest grid of whole patches that
        holds at most max_num_patches, split into flattened patches, padded to max_num_patches."""
        config = self.processor.to_dict()
        record = image_record(
            input_name="pixel_values",
            resize=None,
            interpolation=interpolation_name(config.get("resample", 2), self.ref),
            center_crop=None,
            rescale=config.get("rescale_factor", 1 / 255),
            mean=list(config["image_mean"]),
            std=list(config["image_std"]),
        )
        return {
            **record,
            "kind": "naflex",
            "layout": "N,patches,patch*patch*C",
            "patch_size": int(config["patch_size"]),
            "max_num_patches": int(config["max_num_patches"]),
            "mask_input": "pixel_attention_mask",
            "shapes_input": "spatial_shapes",
        }

    def example_batch(self) -> Batch:
        # Two different patch grids, so the exported graph keeps spatial_shapes as data.
        from PIL import Image

        images = [Image.new("RGB", (64, 64)), Image.new("RGB", (96, 48))]
        out = self.processor(images=images, return_tensors="pt")
        return {
            name: out[name] for name in ("pixel_values", "pixel_attention_mask", "spatial_shapes")
        }


register_hf_family(["siglip"], HFSiglip.load)
register_hf_family(["siglip2"], HFSiglip2.load)
