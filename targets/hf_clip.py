"""transformers `CLIPModel`: OpenAI CLIP, OpenCLIP-HF and MetaCLIP checkpoints.

The image embedding is `visual_projection(pooled vision output)`, a bias-free Linear
(d x width): the edit folds into it exactly as W' = (I + A) W.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from . import register_hf_family
from .base import Batch, OnnxTower, fold_into_linear_layer, open_images
from .hf import HFDualEncoder
from .tiny_vocab import clip_tokenizer


def _pooled(output) -> torch.Tensor:
    # transformers 5 returns an output object whose pooler_output is the projected embedding.
    return output.pooler_output if hasattr(output, "pooler_output") else output


class _ImageTower(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, pixel_values):
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

    def __init__(self, model, tokenizer, processor, ref: str):
        super().__init__(model, tokenizer, processor, ref)
        self.embed_dim = self.edit_width = model.visual_projection.out_features
        self.max_length = model.config.text_config.max_position_embeddings

    # -- embedding ----------------------------------------------------------------------------
    def load_inputs(self, paths: list[Path]) -> Batch:
        return {"pixel_values": self.processor(images=open_images(paths), return_tensors="pt")["pixel_values"]}

    @torch.inference_mode()
    def embed_inputs(self, batch: Batch) -> torch.Tensor:
        return _pooled(self.model.get_image_features(pixel_values=batch["pixel_values"])).float()

    # -- edits --------------------------------------------------------------------------------
    def embed_with(self, module: torch.nn.Module, batch: Batch) -> torch.Tensor:
        return _pooled(module.get_image_features(pixel_values=batch["pixel_values"]))

    def with_edit(self, operator: torch.Tensor) -> "HFClip":
        model = copy.deepcopy(self.model)
        fold_into_linear_layer(model.visual_projection, operator)
        return self._copy(model, "+edit")

    # -- export -------------------------------------------------------------------------------
    def onnx_towers(self) -> list[OnnxTower]:
        size = self.model.config.vision_config.image_size
        channels = self.model.config.vision_config.num_channels
        pixels = torch.zeros(2, channels, size, size)
        return [OnnxTower("vision_model", _ImageTower(self.model).eval(), {"pixel_values": pixels},
                          "image_embeds", {"pixel_values": {0: "batch"}}),
                self.text_onnx_tower(["a photo of a thing.", "a photo."])]


def build_tiny(folder: Path, *, width: int = 32, embed_dim: int = 24, layers: int = 2, heads: int = 2,
               image_size: int = 32, patch_size: int = 8, seed: int = 0) -> Path:
    """Save a small random-weight CLIPModel with a real (byte-level BPE, merges trained on prompt
    English: tiny_vocab) CLIP tokenizer and image processor, built offline from configs: for
    tests, the demo and the zoo."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel
    from transformers.utils import logging

    logging.disable_progress_bar()

    tokenizer = clip_tokenizer()
    vocab = tokenizer.get_vocab()
    eos = vocab["<|endoftext|>"]
    # CLIP pools the EOS position; with eos_token_id == 2 it would fall back to argmax(ids).
    text = dict(vocab_size=len(vocab), hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                num_attention_heads=heads, max_position_embeddings=64, eos_token_id=eos,
                bos_token_id=vocab["<|startoftext|>"], pad_token_id=eos)
    vision = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                  num_attention_heads=heads, image_size=image_size, patch_size=patch_size)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config=vision, projection_dim=embed_dim)).eval()
    processor = CLIPImageProcessor(size={"shortest_edge": image_size},
                                   crop_size={"height": image_size, "width": image_size})
    HFClip(model, tokenizer, processor, ref="tiny").save_native(folder)
    return folder


register_hf_family(["clip"], HFClip.load)
