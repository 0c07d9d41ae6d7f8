"""The protocols every model family implements, and the pieces it hands the compiler.

A family wraps a dual encoder (image or audio tower + text tower). The compiler only ever
calls these methods; it never asks which family it holds. The core (DualEncoder: embed,
fingerprint, edit) is apart from writing a model out (Exportable) and from training it
(Trainable: sources, the adapter route, the lab's pretraining), so each part of the compiler
is typed against only what it uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from typing_extensions import Self

from ptc.hashing import tensors_sha256
from ptc.targets.serving import ServingSpec

# A batch is the input tower's named inputs, batch-first (e.g. {"pixel_values": N x C x H x W});
# its keys are the input tower's ONNX input names, so a batch feeds the exported graph as it is.
Batch = dict[str, torch.Tensor]
ModuleT = TypeVar("ModuleT", bound=torch.nn.Module)


def batch_rows(batch: Batch, index: slice | torch.Tensor) -> Batch:
    return {name: tensor[index] for name, tensor in batch.items()}


def batch_to(batch: Batch, device: torch.device | str) -> Batch:
    return {name: tensor.to(device) for name, tensor in batch.items()}


def batch_len(batch: Batch) -> int:
    return len(next(iter(batch.values())))


class OnDevice:
    """`device` and `to_device` of a family that holds its torch module as `self.model`, and
    `here`: a batch moved to where the module is."""

    # The library's model object (a transformers or open_clip module): its attributes are the
    # library's own tree, so the checker takes them as it finds them.
    model: Any

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def to_device(self, device: torch.device) -> None:
        self.model.to(device)

    def here(self, batch: Batch) -> Batch:
        return batch_to(batch, self.device)


@dataclass(frozen=True)
class OnnxTower:
    """A tower ready for export: an eval-mode module, example inputs (batch >= 2) in input
    order, the output name, and which input axes are dynamic."""

    name: str  # file stem, e.g. "vision_model"
    module: torch.nn.Module
    example_inputs: dict[str, torch.Tensor]
    output_name: str
    dynamic_axes: dict[str, dict[int, str]] = field(default_factory=dict)


@runtime_checkable
class DualEncoder(Protocol):
    """The core: what the compiler needs to embed, fingerprint and edit a model."""

    ref: str  # the reference it was loaded from
    embed_dim: int  # width of the embedding the edit acts on
    # The closed-form edit is a matrix E (embed_dim x edit_width) acting through regressor rows
    # R(x): the edited model embeds z + R E^T exactly. A fold of (I + A) into the last affine
    # has R = z and E = A; a residual head (SigLIP) has R = [u; 1] and E = [dW2 db2].
    edit_width: int
    # True where R = z (an (I + A) fold): the input tower's graph then gives everything an edit
    # needs, so its embedding passes may run on another runtime than torch.
    edit_acts_on_embeddings: bool

    def load_inputs(self, paths: list[Path]) -> Batch:
        """Read probe files and preprocess them into one model input batch."""

    def embed_inputs(self, batch: Batch) -> torch.Tensor:
        """Unnormalised embeddings z (n x d) of a preprocessed batch."""

    def embed_for_edit(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(z, R) in one forward pass: the embeddings and the regressor rows (n x edit_width)
        an edit acts through; R is None where it is z itself (stored once)."""

    def embed_prompts(self, prompts: list[str]) -> torch.Tensor:
        """Unnormalised text embeddings (n x d), tokenised the family's own way."""

    def input_fingerprint(self) -> str:
        """Hash of everything that maps a probe file to its embedding (weights, preprocessing)."""

    def text_fingerprint(self) -> str:
        """Hash of everything that maps a prompt to its embedding (weights, tokenizer)."""

    def with_adapter(self, adapter_dir: Path, scale: float = 1.0) -> Self:
        """A copy with a peft adapter merged into its weights (at `scale` times its strength)."""

    def with_edit(self, edit: torch.Tensor) -> Self:
        """A copy that embeds z + R E^T for every input, the edit folded into its weights."""

    @property
    def device(self) -> torch.device:
        """Where its forward passes run; embeddings always come back on the CPU."""

    def to_device(self, device: torch.device) -> None:
        """Move its weights to `device` (a copy made by with_edit shares them, so moves too)."""


@runtime_checkable
class Exportable(Protocol):
    """Writing a model out: its towers as ONNX, its checkpoint natively, its model card's facts."""

    library: str  # the library whose format save_native writes, e.g. "transformers"
    # Hugging Face task tag for model cards, e.g. "zero-shot-image-classification"
    pipeline_tag: str
    edit_site: str  # where the edit lives, for the model card, e.g. "`visual_projection`"
    # the Hugging Face Hub id it was loaded from (via the local cache), else None
    hub_id: str | None

    def onnx_towers(self) -> list[OnnxTower]:
        """The towers to export: the input tower first, its inputs named as a batch's keys
        (e.g. pixel_values -> image_embeds)."""

    def save_native(self, folder: Path) -> str:
        """Save in the family's own library format; return the scheme that reloads it
        (`f"{scheme}:{folder}"`)."""

    def load_snippet(self, folder: str) -> str:
        """Three lines of Python that load a checkpoint saved by save_native from `folder`."""

    def serving_spec(self) -> ServingSpec:
        """What an ONNX-only client needs besides the graphs: preprocessing as data, the
        tokenizer as a `tokenizers` file (targets/serving.py)."""

    def prompt_tokens(self, prompts: list[str]) -> Batch:
        """The text graph's inputs for `prompts`, tokenised and padded the family's own way:
        what the serving contract's tokenizer must reproduce."""


@runtime_checkable
class Trainable(Protocol):
    """Training (sources, the adapter route, the lab's pretraining): peft or a trainer works on a
    copy of the torch module; the family says which of its input tower's parameters a LoRA
    adapts (the attention q and v projections where it has them) and how to run a copy."""

    # peft LoraConfig targeting keywords: target_modules and/or target_parameters
    lora_targets: dict[str, Any]
    contrastive_loss: str  # how the family was pre-trained: "softmax" (CLIP) or "sigmoid" (SigLIP)

    def trainable(self) -> torch.nn.Module:
        """A deep copy of the underlying torch module, for peft to wrap or a trainer to train."""

    def embed_with(self, module: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """Unnormalised input embeddings through `module` (a trained copy), autograd on."""

    def embed_prompts_with(self, module: torch.nn.Module, prompts: list[str]) -> torch.Tensor:
        """Unnormalised text embeddings through `module` (a trained copy), autograd on."""

    def with_module(self, module: torch.nn.Module) -> Self:
        """This encoder with its torch module replaced by `module` (a trained copy)."""


class Family(DualEncoder, Exportable, Trainable, Protocol):
    """What a family module's class implements: all three (test_families holds each to it)."""


def fingerprint_tensors(named: dict[str, torch.Tensor], extra: str = "") -> str:
    """Hash of named tensors plus a free-form string (configs, tokenizer)."""
    return tensors_sha256(named, prefix=extra)


def fold_into_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, operator: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """z = W h + b becomes (I + A) z for every h: W' = (I + A) W, b' = (I + A) b (float64)."""
    edit = torch.eye(operator.shape[0], dtype=torch.float64) + operator.double()
    if weight.shape[0] != edit.shape[0]:
        raise ValueError(
            f"operator is {tuple(operator.shape)} but the layer writes {weight.shape[0]} features"
        )
    new_weight = (edit @ weight.double()).to(weight.dtype)
    new_bias = None if bias is None else (edit @ bias.double()).to(bias.dtype)
    return new_weight, new_bias


def fold_into_linear_layer(layer: torch.nn.Linear, operator: torch.Tensor) -> None:
    """`fold_into_linear` written into an nn.Linear in place (call it on a copy)."""
    weight, bias = fold_into_linear(layer.weight.data, layer.bias, operator)
    layer.weight.data.copy_(weight)
    if bias is not None:
        layer.bias.data.copy_(bias)


def copy_sharing(model: ModuleT, edited: list[torch.Tensor]) -> ModuleT:
    """A copy of `model` that shares every parameter and buffer with it except the `edited`
    ones, which are its own to write an edit into. An edit changes one or two tensors of a
    model of hundreds of MB: a deep copy would hold the whole model twice (the peak memory of
    a real-size build), and the base model is still needed, unchanged, for verification."""
    import copy

    fresh = {id(t) for t in edited}
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()] if id(t) not in fresh}
    return copy.deepcopy(model, memo=shared)


def merge_adapter(
    model: torch.nn.Module, adapter_dir: Path, ref: str, scale: float = 1.0
) -> torch.nn.Module:
    """A copy of `model` with the peft adapter in `adapter_dir` merged in at `scale` times its
    trained strength (1: the fine-tune itself; 0.5: task arithmetic at half strength)."""
    from peft.tuners.lora import LoraLayer

    from ptc.targets.shipped_code import refuse_unsafe_adapter

    refuse_unsafe_adapter(adapter_dir, ref)
    wrapped = _load_adapter_checked(model, Path(adapter_dir), ref)
    if scale != 1.0:
        for layer in wrapped.modules():
            if isinstance(layer, LoraLayer):
                layer.scale_layer(scale)
    return wrapped.merge_and_unload()


def _load_adapter_checked(model: torch.nn.Module, adapter_dir: Path, ref: str) -> Any:
    """PeftModel.from_pretrained on a copy, held to its adapter_config.json as a checkpoint is
    to its config: peft warns of adapter weights it could not place and leaves those layers at
    their initial (zero) update, so the file's tensors are compared with what the config builds
    (peft's own saved names and shapes) and any difference refused, and every value is finite."""
    import copy
    import warnings

    from peft import PeftModel
    from peft.utils import get_peft_model_state_dict

    from ptc.errors import library_errors
    from ptc.finite import require_finite
    from ptc.targets.checkpoint import require_matching, stored_tensors
    from ptc.targets.shipped_code import ADAPTER_WEIGHTS

    weights = adapter_dir / ADAPTER_WEIGHTS
    with (
        library_errors(
            f"cannot apply the peft adapter {adapter_dir} to {ref}",
            "the adapter must have been trained on this base model",
        ),
        warnings.catch_warnings(),
    ):
        # missing or resized weights are reported below, in one line
        warnings.simplefilter("ignore")
        stored = stored_tensors([weights])
        wrapped = PeftModel.from_pretrained(
            copy.deepcopy(model), adapter_dir, ignore_mismatched_sizes=True
        )
    # the names and shapes it saves
    loaded = get_peft_model_state_dict(wrapped, save_embedding_layers=False)
    require_matching(
        {name: tuple(tensor.shape) for name, tensor in loaded.items()},
        stored,
        f"{ref}: adapter {adapter_dir}",
        "adapter_config.json",
        missing_effect="those layers would not be adapted",
    )
    require_finite(
        loaded,
        f"{ref}: adapter {weights}",
        "the adapter is damaged (or its training diverged); ptc merges no weight that is NaN or Inf",
    )
    return wrapped
