"""The `hf:` scheme: a local checkpoint folder or a model id already in the local Hugging
Face cache. Never the network; never a pickle (`use_safetensors=True`). Also the base class
that the transformers families share."""

from __future__ import annotations

import copy
import hashlib
import json
import os
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from typing_extensions import Self

from ptc.errors import ModelError, ModelNotFound, OutputError, library_errors
from ptc.files import write_bytes_atomic
from ptc.targets import HF_MODEL_TYPES, register_scheme
from ptc.targets.base import Batch, Family, OnDevice, OnnxTower, fingerprint_tensors, merge_adapter
from ptc.targets.checkpoint import (
    declared_shapes,
    describe_mismatch,
    require_finite_weights,
    require_plausible_size,
    stored_tensors,
)
from ptc.targets.serving import (
    ServingSpec,
    image_record,
    interpolation_name,
    sentencepiece_json,
    with_rules,
)
from ptc.targets.shipped_code import refuse_shipped_code

# Loading must never reach a hub: set before transformers / huggingface_hub read them.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PICKLE_WEIGHTS = (
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
    "tf_model.h5",
    "flax_model.msgpack",
)


def _cache_dir_for(model_id: str) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - huggingface_hub comes with transformers
        return None
    if model_id.count("/") > 1 or model_id.startswith(("/", ".")):
        return None
    found = try_to_load_from_cache(model_id, "config.json")
    return Path(found).parent if isinstance(found, str) else None


def resolve_dir(rest: str, base_dir: Path) -> Path:
    """The local folder an `hf:` reference names, or ModelNotFound saying where it looked."""
    local = (base_dir / Path(rest).expanduser()).resolve()
    if local.is_dir():
        folder = local
    else:
        cached = _cache_dir_for(rest)
        if cached is None:
            from huggingface_hub.constants import HF_HUB_CACHE

            raise ModelNotFound(
                f"hf:{rest}: no such model folder (looked at {local}) and not in the local "
                f"Hugging Face cache (looked in {HF_HUB_CACHE})",
                "ptc never downloads; fetch the checkpoint on a machine with network and copy it here",
            )
        folder = cached
    if not (folder / "config.json").is_file():
        raise ModelNotFound(
            f"hf:{rest}: {folder} has no config.json", "point hf: at a save_pretrained folder"
        )
    if not any(folder.glob("*.safetensors")):
        pickled = [name for name in PICKLE_WEIGHTS if (folder / name).exists()]
        if pickled:
            raise ModelError(
                f"hf:{rest}: {folder} holds only pickle weights ({pickled[0]}); ptc never "
                "unpickles checkpoint files",
                "convert it to safetensors on a trusted machine",
            )
        raise ModelNotFound(f"hf:{rest}: {folder} has no *.safetensors weights")
    refuse_shipped_code(folder, f"hf:{rest}")
    return folder


def _family_for(folder: Path, rest: str) -> Callable[..., Family]:
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, json.JSONDecodeError) as exc:
        raise ModelError(f"hf:{rest}: cannot read {folder / 'config.json'}: {exc}") from None
    if model_type not in HF_MODEL_TYPES:
        raise ModelError(
            f"hf:{rest}: model_type {model_type!r} is not a supported family",
            f"supported model types: {', '.join(sorted(HF_MODEL_TYPES))}",
        )
    return HF_MODEL_TYPES[model_type]


def load(rest: str, base_dir: Path) -> Family:
    folder = resolve_dir(rest, base_dir)
    encoder = _family_for(folder, rest)(folder, ref=f"hf:{rest}")
    # Not a local folder, so resolve_dir found it in the Hub cache: the name is a Hub id.
    encoder.hub_id = None if (base_dir / Path(rest).expanduser()).is_dir() else rest
    return encoder


def check(rest: str, base_dir: Path) -> str:
    folder = resolve_dir(rest, base_dir)
    _family_for(folder, rest)
    return str(folder)


register_scheme("hf", load, check)


class HFDualEncoder(OnDevice):
    """What every transformers dual encoder shares: loading from a save_pretrained folder
    (weights, tokenizer, processor), fingerprints over named parameter prefixes, peft merges
    and native saves. A family subclass says which model class it loads, which parameters
    belong to which tower, and how it embeds and folds."""

    model_class: str  # transformers class name, e.g. "CLIPModel"
    fingerprint_tag: str  # family tag hashed into fingerprints, e.g. "hf-clip"
    input_prefixes: tuple[str, ...]  # state-dict prefixes of the input tower
    text_prefixes: tuple[str, ...]
    library = "transformers"
    pipeline_tag = "zero-shot-image-classification"
    hub_id: str | None = None
    contrastive_loss = "softmax"
    edit_acts_on_embeddings = True

    def __init__(self, model: Any, tokenizer: Any, processor: Any, ref: str):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.processor = processor
        self.ref = ref

    @classmethod
    def load(cls, folder: Path, ref: str) -> Self:
        import transformers
        from transformers import AutoTokenizer
        from transformers.utils import logging

        logging.disable_progress_bar()
        for needed in ("tokenizer_config.json", "preprocessor_config.json"):
            if not (folder / needed).is_file():
                raise ModelError(
                    f"{ref}: {folder} has no {needed}",
                    "save the tokenizer and processor next to the weights "
                    "(tokenizer.save_pretrained / processor.save_pretrained)",
                )
        with library_errors(f"{ref}: cannot load from {folder}"):
            model = cls._load_checked(getattr(transformers, cls.model_class), folder, ref)
            tokenizer = AutoTokenizer.from_pretrained(
                folder, local_files_only=True, trust_remote_code=False
            )
            processor = cls.load_processor(folder)
        return cls(model, tokenizer, processor, ref)

    @staticmethod
    def _load_checked(model_class: Any, folder: Path, ref: str) -> Any:
        """from_pretrained, held to its config: sized on the meta device before anything is
        allocated, then every weight transformers reports missing, unexpected or resized (its
        own rules: tied weights, renamed legacy keys) refused, and every weight finite."""
        config_file = "config.json"
        config = model_class.config_class.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )
        stored = stored_tensors(sorted(folder.glob("*.safetensors")))
        require_plausible_size(
            declared_shapes(lambda: model_class(config)), stored, ref, config_file
        )
        model, info = model_class.from_pretrained(
            folder,
            config=config,
            local_files_only=True,
            use_safetensors=True,
            trust_remote_code=False,
            output_loading_info=True,
            ignore_mismatched_sizes=True,
        )
        mismatched = [
            (name, tuple(in_file), tuple(built)) for name, in_file, built in info["mismatched_keys"]
        ]
        problem = describe_mismatch(
            ref,
            config_file,
            list(info["missing_keys"]),
            list(info["unexpected_keys"]),
            sorted(mismatched),
            stored,
        )
        if problem is not None:
            raise problem
        require_finite_weights(model, ref, stored)
        return model

    @staticmethod
    def load_processor(folder: Path) -> Any:
        from transformers import AutoImageProcessor

        return AutoImageProcessor.from_pretrained(
            folder, local_files_only=True, trust_remote_code=False
        )

    # -- embedding defaults -------------------------------------------------------------------
    # Pad every prompt to max_length (SigLIP, trained on full-context prompts) or to the
    # longest in the batch; the text ONNX graph's sequence axis is dynamic only in the latter.
    pad_to_max_length = False

    max_length: int  # the text context, in tokens

    def embed_inputs(self, batch: Batch) -> torch.Tensor:
        """Unnormalised input embeddings: each family's own."""
        raise NotImplementedError

    def embed_for_edit(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.embed_inputs(batch), None  # an (I + A) fold: the edit acts on z itself

    @staticmethod
    def text_embedding(
        model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        """Unnormalised text embeddings through `model` (transformers 5: `.pooler_output`)."""
        return model.get_text_features(
            input_ids=input_ids, attention_mask=attention_mask
        ).pooler_output

    def _tokenize(self, prompts: list[str]) -> Any:
        return self.tokenizer(
            prompts,
            padding="max_length" if self.pad_to_max_length else True,
            truncation=True,
            max_length=self.max_length,
            return_tensors="pt",
        )

    @torch.inference_mode()
    def embed_prompts(self, prompts: list[str]) -> torch.Tensor:
        tokens = self.here(dict(self._tokenize(prompts)))
        return (
            self.text_embedding(self.model, tokens["input_ids"], tokens["attention_mask"])
            .float()
            .cpu()
        )

    def prompt_tokens(self, prompts: list[str]) -> Batch:
        tokens = self._tokenize(prompts)
        return {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]}

    def embed_prompts_with(self, module: torch.nn.Module, prompts: list[str]) -> torch.Tensor:
        tokens = self._tokenize(prompts)
        return self.text_embedding(
            module,
            tokens["input_ids"].to(module.device),
            tokens["attention_mask"].to(module.device),
        )

    def text_onnx_tower(self, example_prompts: list[str]) -> OnnxTower:
        tokens = self._tokenize(example_prompts)
        axes = {0: "batch"} if self.pad_to_max_length else {0: "batch", 1: "sequence"}
        return OnnxTower(
            "text_model",
            _TextTower(self.model, self.text_embedding).eval(),
            {"input_ids": tokens["input_ids"], "attention_mask": tokens["attention_mask"]},
            "text_embeds",
            {"input_ids": axes, "attention_mask": axes},
        )

    # -- identity -----------------------------------------------------------------------------
    def _params(self, prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
        return {k: v for k, v in self.model.state_dict().items() if k.startswith(prefixes)}

    @cached_property
    def _input_fp(self) -> str:
        return fingerprint_tensors(
            self._params(self.input_prefixes),
            f"{self.fingerprint_tag}|" + self.processor.to_json_string(),
        )

    @cached_property
    def _text_fp(self) -> str:
        return fingerprint_tensors(
            self._params(self.text_prefixes),
            f"{self.fingerprint_tag}|" + tokenizer_identity(self.tokenizer),
        )

    def input_fingerprint(self) -> str:
        return self._input_fp

    def text_fingerprint(self) -> str:
        return self._text_fp

    # -- edits and saving ---------------------------------------------------------------------
    def _copy(self, model: Any, ref_suffix: str) -> Self:
        return type(self)(model, self.tokenizer, self.processor, self.ref + ref_suffix)

    def with_module(self, module: torch.nn.Module) -> Self:
        return self._copy(module.eval(), "+trained")

    def with_adapter(self, adapter_dir: Path, scale: float = 1.0) -> Self:
        merged = merge_adapter(self.model, adapter_dir, self.ref, scale)
        return self._copy(
            merged, f"+adapter:{adapter_dir}" + (f"*{scale:g}" if scale != 1.0 else "")
        )

    def trainable(self) -> torch.nn.Module:
        return copy.deepcopy(self.model).eval()  # eval: no dropout; keeps runs deterministic

    def load_snippet(self, folder: str) -> str:
        return (
            f"from transformers import AutoProcessor, {self.model_class}\n"
            f'model = {self.model_class}.from_pretrained("{folder}")\n'
            f'processor = AutoProcessor.from_pretrained("{folder}")'
        )

    # -- serving ------------------------------------------------------------------------------
    def serving_spec(self) -> ServingSpec:
        padding = "max_length" if self.pad_to_max_length else "longest"
        pad_id, pad_token = int(self.tokenizer.pad_token_id), str(self.tokenizer.pad_token)
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        own = backend.to_str() if backend is not None else sentencepiece_json(self.tokenizer)
        sides = (str(self.tokenizer.padding_side), str(self.tokenizer.truncation_side))
        return ServingSpec(
            preprocessing=self.serving_preprocessing(),
            tokenizer_json=with_rules(own, self.max_length, padding, (pad_id, pad_token), sides),
            context_length=self.max_length,
            padding=padding,
            pad_id=pad_id,
            text_inputs=("input_ids", "attention_mask"),
            padding_side=sides[0],
            truncation_side=sides[1],
        )

    def serving_preprocessing(self) -> dict[str, Any]:
        """A fixed-size image processor's settings (CLIP's, SigLIP's) as the contract's record.
        transformers' processors crop at the floor of the centring offset."""
        config = self.processor.to_dict()
        size = {k: int(v) for k, v in (config.get("size") or {}).items() if v is not None}
        if config.get("do_resize", True) and sorted(size) not in (
            ["shortest_edge"],
            ["height", "width"],
        ):
            raise OutputError(
                f"{self.ref}: its processor resizes to {size}, which the serving contract does "
                "not describe",
                "save the processor with size {shortest_edge: N} or {height: H, width: W}",
            )
        crop = config.get("crop_size") if config.get("do_center_crop") else None
        normalise = config.get("do_normalize", True)
        return image_record(
            input_name="pixel_values",
            resize=size if config.get("do_resize", True) else None,
            interpolation=interpolation_name(config.get("resample", 3), self.ref),
            center_crop=None
            if crop is None
            else {"height": int(crop["height"]), "width": int(crop["width"]), "offset": "floor"},
            rescale=config.get("rescale_factor", 1 / 255) if config.get("do_rescale", True) else 1,
            mean=list(config["image_mean"]) if normalise else [0.0, 0.0, 0.0],
            std=list(config["image_std"]) if normalise else [1.0, 1.0, 1.0],
        )

    def save_native(self, folder: Path) -> str:
        Path(folder).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder)
        save_tokenizer(self.tokenizer, folder)
        self.processor.save_pretrained(folder)
        state_text_limit(folder, self.max_length)
        return "hf"


class _TextTower(torch.nn.Module):
    def __init__(
        self, model: Any, text_embedding: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]
    ):
        super().__init__()
        self.model, self.text_embedding = model, text_embedding

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.text_embedding(self.model, input_ids, attention_mask)


def state_text_limit(folder: Path, context: int) -> None:
    """The model's text context, where every reader of a checkpoint folder looks for a text
    limit. transformers 4.x gives a config without a top-level `max_length` the generation
    default of 20, and servers that take it as the text limit cut every prompt there; a
    tokenizer saved without `model_max_length` says 1e30, and a prompt past the context then
    crashes the model in sentence-transformers instead of being truncated."""
    for name, key in (("config.json", "max_length"), ("tokenizer_config.json", "model_max_length")):
        path = folder / name
        document = json.loads(path.read_text(encoding="utf-8"))
        document[key] = context
        text = json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
        write_bytes_atomic(path, text.encode("utf-8"))


def save_tokenizer(tokenizer: Any, folder: Path) -> None:
    """save_pretrained, without the last call's truncation and padding, which a fast tokenizer
    keeps in its backend and writes into tokenizer.json: call state, not the tokenizer, and it
    made two builds of the same inputs differ (a cold build tokenizes prompts, a warm one not)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()
    tokenizer.save_pretrained(folder)


def tokenizer_identity(tokenizer: Any) -> str:
    """What maps a prompt to token ids: the serialised fast tokenizer, or the bytes of a
    sentencepiece model. The fast tokenizer also records the last call's truncation and
    padding settings; those are call state, not identity, so they stay out."""
    vocab_file = getattr(tokenizer, "vocab_file", None)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        spec.pop("truncation", None), spec.pop("padding", None)
        return json.dumps(spec, sort_keys=True)
    if vocab_file and Path(vocab_file).is_file():
        return (
            f"{type(tokenizer).__name__}|"
            + hashlib.sha256(Path(vocab_file).read_bytes()).hexdigest()
        )
    return f"{type(tokenizer).__name__}|" + json.dumps(tokenizer.get_vocab(), sort_keys=True)
