"""open_clip models: `open_clip:local-dir:PATH` (open_clip_config.json + open_clip_model.safetensors)
or `open_clip:ARCH@WEIGHTS.safetensors` (a registered architecture with a local checkpoint).

The image embedding is written by the tower's last affine, which depends on the tower:
ViT's bare `visual.proj` parameter (applied as x @ proj, so the fold is proj' = proj (I + A)^T),
ModifiedResNet's attention-pool `c_proj`, or a timm tower's head projection (EVA02).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from ptc.errors import ModelError, ModelNotFound, OutputError, library_errors
from ptc.media import open_images
from ptc.targets import register_scheme
from ptc.targets.base import (
    Batch,
    OnDevice,
    OnnxTower,
    copy_sharing,
    fingerprint_tensors,
    fold_into_linear,
    fold_into_linear_layer,
    merge_adapter,
)
from ptc.targets.checkpoint import (
    build_assigned,
    declared_shapes,
    require_finite_weights,
    require_matching,
    require_plausible_size,
    stored_tensors,
)
from ptc.targets.hf import save_tokenizer
from ptc.targets.serving import ServingSpec, clip_bpe_json, image_record, with_rules
from ptc.targets.shipped_code import refuse_foreign_towers, refuse_pickle_file, refuse_shipped_code

CONFIG, WEIGHTS = "open_clip_config.json", "open_clip_model.safetensors"
# Plugins that add timm towers (timm's registry is global and names fix sizes) register a
# function here; each runs once, before the first open_clip model is built.
TOWER_HOOKS: list[Callable[[], None]] = []
# Where each tower kind writes its embedding, tried in order (a table, not branches).
PROJECTIONS = ("visual.proj", "visual.attnpool.c_proj", "visual.head.proj", "visual.trunk.head")


class _ImageTower(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.encode_image(pixel_values)


class _TextTower(torch.nn.Module):
    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.encode_text(input_ids)


def _resolve(rest: str, base_dir: Path) -> tuple[dict[str, Any], Path, str]:
    """(open_clip config with model_cfg and preprocess_cfg, weights file, where it looked)."""
    import open_clip

    if rest.startswith("local-dir:"):
        folder = (base_dir / Path(rest[len("local-dir:") :]).expanduser()).resolve()
        config_path, weights = folder / CONFIG, folder / WEIGHTS
        if not config_path.is_file() or not weights.is_file():
            raise ModelNotFound(
                f"open_clip:{rest}: expected {CONFIG} and {WEIGHTS} in {folder}",
                "save with `ptc build` or open_clip's push_to_hf_hub layout",
            )
        refuse_shipped_code(folder, f"open_clip:{rest}")
        config = json.loads(config_path.read_text())  # refuse_shipped_code parsed it already
        if not isinstance(config, dict) or not isinstance(config.get("model_cfg"), dict):
            raise ModelError(f"open_clip:{rest}: {config_path} has no model_cfg mapping")
        refuse_foreign_towers(config["model_cfg"], str(config_path), f"open_clip:{rest}")
        return config, weights, str(folder)
    arch, sep, file = rest.partition("@")
    if not sep:
        raise ModelNotFound(
            f"open_clip:{rest}: give a local checkpoint as open_clip:{rest}@/path/weights.safetensors "
            "or a folder as open_clip:local-dir:/path",
            "ptc never downloads pretrained weights",
        )
    model_cfg = open_clip.get_model_config(arch)
    if model_cfg is None:
        raise ModelNotFound(
            f"open_clip:{rest}: unknown architecture {arch!r}",
            f"known: {', '.join(open_clip.list_models()[:8])} ...",
        )
    weights = (base_dir / Path(file).expanduser()).resolve()
    refuse_pickle_file(weights, f"open_clip:{rest}")
    if weights.suffix != ".safetensors":
        raise ModelError(
            f"open_clip:{rest}: {weights.name} is not a safetensors file; ptc never unpickles "
            "checkpoint files",
            "convert it to safetensors on a trusted machine",
        )
    if not weights.is_file():
        raise ModelNotFound(f"open_clip:{rest}: no checkpoint at {weights}")
    refuse_foreign_towers(model_cfg, f"open_clip's config {arch!r}", f"open_clip:{rest}")
    return {"model_cfg": model_cfg, "preprocess_cfg": {}}, weights, str(weights)


class OpenClip(OnDevice):
    """A loaded open_clip CLIP with its tokenizer and preprocessing."""

    library = "open_clip"
    pipeline_tag = "zero-shot-image-classification"
    hub_id: str | None = None  # local checkpoints only: ptc reads no hf-hub: reference
    contrastive_loss = "softmax"
    edit_acts_on_embeddings = True

    def __init__(
        self, model: Any, config: dict[str, Any], preprocess: Any, tokenizer: Any, ref: str
    ) -> None:
        self.model, self.config, self.ref = model.eval(), config, ref
        self.preprocess, self.tokenizer = preprocess, tokenizer
        found = next((p for p in PROJECTIONS if _get(model, p) is not None), None)
        if found is None:
            raise ModelError(
                f"{ref}: no image projection found (looked for {', '.join(PROJECTIONS)})"
            )
        self.projection_path: str = found
        self.embed_dim = self.edit_width = int(config["model_cfg"]["embed_dim"])
        self.edit_site = f"the image projection (`{self.projection_path}`) as W' = (I + A) W"
        self.lora_targets = _lora_targets(model)

    @classmethod
    def load(cls, rest: str, base_dir: Path) -> OpenClip:
        import open_clip
        from open_clip.transform import PreprocessCfg, image_transform_v2
        from safetensors.torch import load_file

        config, weights, _ = _resolve(rest, base_dir)
        model_cfg, ref = config["model_cfg"], f"open_clip:{rest}"
        # first: it may refuse before a large model is built
        tokenizer = _tokenizer(rest, weights.parent, model_cfg)
        _run_tower_hooks()

        def build() -> Any:
            # `custom_text` picks the class (as create_model reads it); neither class takes it.
            kwargs = {k: v for k, v in model_cfg.items() if k != "custom_text"}
            if model_cfg.get("custom_text"):
                return open_clip.CustomTextCLIP(**kwargs)
            return open_clip.CLIP(**kwargs)

        config_file = (
            CONFIG
            if rest.startswith("local-dir:")
            else f"open_clip's config {rest.partition('@')[0]!r}"
        )
        with library_errors(f"{ref}: cannot load {weights}"):
            stored = stored_tensors([weights])
            declared = declared_shapes(build)
            require_plausible_size(declared, stored, ref, config_file)
            # The attention masks are buffers the model rebuilds; open_clip's own writer leaves them out.
            require_matching(
                declared, stored, ref, config_file, ignore=lambda name: "attn_mask" in name
            )
            model: Any = build_assigned(build, load_file(str(weights)), ref)
        require_finite_weights(model, ref, stored)
        with library_errors(f"{ref}: preprocess_cfg"):
            preprocess_cfg = {
                **open_clip.get_model_preprocess_cfg(model),
                **config.get("preprocess_cfg", {}),
            }
            model.visual.preprocess_cfg = preprocess_cfg
            preprocess = image_transform_v2(PreprocessCfg(**preprocess_cfg), is_train=False)
        return cls(
            model,
            {"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg},
            preprocess,
            tokenizer,
            ref,
        )

    # -- embedding ----------------------------------------------------------------------------
    def load_inputs(self, paths: list[Path]) -> Batch:
        return {
            "pixel_values": torch.stack([self.preprocess(image) for image in open_images(paths)])
        }

    @torch.inference_mode()
    def embed_inputs(self, batch: Batch) -> torch.Tensor:
        return self.model.encode_image(self.here(batch)["pixel_values"]).float().cpu()

    def embed_for_edit(self, batch: Batch) -> tuple[torch.Tensor, None]:
        return self.embed_inputs(batch), None  # an (I + A) fold: the edit acts on z itself

    @torch.inference_mode()
    def embed_prompts(self, prompts: list[str]) -> torch.Tensor:
        return self.model.encode_text(self.tokenizer(prompts).to(self.device)).float().cpu()

    # -- identity -----------------------------------------------------------------------------
    def _state(self, visual: bool) -> dict[str, torch.Tensor]:
        return {
            k: v
            for k, v in self.model.state_dict().items()
            if k.startswith("visual.") == visual and not k.startswith("logit_")
        }

    @cached_property
    def _input_fp(self) -> str:
        return fingerprint_tensors(
            self._state(True), "open_clip|" + json.dumps(self.config, sort_keys=True)
        )

    @cached_property
    def _text_fp(self) -> str:
        tokenizer = f"{type(self.tokenizer).__name__}|{self.tokenizer.context_length}|{_vocab_size(self.tokenizer)}"
        return fingerprint_tensors(self._state(False), "open_clip|" + tokenizer)

    def input_fingerprint(self) -> str:
        return self._input_fp

    def text_fingerprint(self) -> str:
        return self._text_fp

    # -- edits --------------------------------------------------------------------------------
    def with_adapter(self, adapter_dir: Path, scale: float = 1.0) -> OpenClip:
        merged = merge_adapter(self.model, adapter_dir, self.ref, scale)
        suffix = f"+adapter:{adapter_dir}" + (f"*{scale:g}" if scale != 1.0 else "")
        return OpenClip(merged, self.config, self.preprocess, self.tokenizer, self.ref + suffix)

    def trainable(self) -> torch.nn.Module:
        return copy.deepcopy(self.model).eval()

    def with_module(self, module: torch.nn.Module) -> OpenClip:
        return OpenClip(
            module.eval(), self.config, self.preprocess, self.tokenizer, self.ref + "+trained"
        )

    def embed_with(self, module: Any, batch: Batch) -> torch.Tensor:
        return module.encode_image(batch["pixel_values"])

    def prompt_tokens(self, prompts: list[str]) -> Batch:
        return {"input_ids": self.tokenizer(prompts)}

    def embed_prompts_with(self, module: Any, prompts: list[str]) -> torch.Tensor:
        return module.encode_text(self.tokenizer(prompts).to(next(module.parameters()).device))

    def with_edit(self, operator: torch.Tensor) -> OpenClip:
        site = _get(self.model, self.projection_path)
        model = copy_sharing(
            self.model, list(site.parameters()) if isinstance(site, torch.nn.Module) else [site]
        )
        target = _get(model, self.projection_path)
        if isinstance(target, torch.nn.Linear):
            fold_into_linear_layer(target, operator)
        else:  # a bare (width x d) parameter used as x @ proj: z' = (I + A) z means proj' = proj (I + A)^T
            weight, _ = fold_into_linear(target.data.T, None, operator)
            target.data.copy_(weight.T)
        return OpenClip(model, self.config, self.preprocess, self.tokenizer, self.ref + "+edit")

    # -- export -------------------------------------------------------------------------------
    def onnx_towers(self) -> list[OnnxTower]:
        size = self.model.visual.image_size
        size = size if isinstance(size, (tuple, list)) else (size, size)
        pixels = torch.zeros(2, 3, *size)
        return [
            OnnxTower(
                "vision_model",
                _ImageTower(self.model).eval(),
                {"pixel_values": pixels},
                "image_embeds",
                {"pixel_values": {0: "batch"}},
            ),
            OnnxTower(
                "text_model",
                _TextTower(self.model).eval(),
                {"input_ids": self.tokenizer(["a photo of a thing.", "a photo."])},
                "text_embeds",
                {"input_ids": {0: "batch"}},
            ),
        ]

    # -- serving ------------------------------------------------------------------------------
    def serving_spec(self) -> ServingSpec:
        import open_clip

        tokenizer, context = self.tokenizer, int(self.tokenizer.context_length)
        if isinstance(tokenizer, open_clip.tokenizer.HFTokenizer):
            hf = tokenizer.tokenizer
            own, pad_id, pad = hf.backend_tokenizer.to_str(), hf.pad_token_id, str(hf.pad_token)
        else:
            merges = list(tokenizer.bpe_ranks)
            own, pad_id, pad = (
                clip_bpe_json(tokenizer.encoder, merges, tokenizer.pat.pattern),
                0,
                "!",
            )
        # open_clip pads every prompt to the context, with 0 for its own BPE (id 0 is "!":
        # the text tower pools at the end token, so what pads never reaches the embedding)
        return ServingSpec(
            preprocessing=self._image_record(),
            tokenizer_json=with_rules(own, context, "max_length", (int(pad_id), pad)),
            context_length=context,
            padding="max_length",
            pad_id=int(pad_id),
            text_inputs=("input_ids",),
        )

    def _image_record(self) -> dict[str, Any]:
        """open_clip's eval transform as the contract's record: torchvision's Resize and
        CenterCrop on a PIL image (the centring offset rounded half to even), or, for a longest
        edge or a non-square target, its ResizeKeepRatio and CenterCropOrPad."""
        from open_clip.transform import PreprocessCfg

        cfg = PreprocessCfg(**self.config["preprocess_cfg"])  # with open_clip's own defaults
        size = cfg.size
        height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
        mode, interpolation = cfg.resize_mode, cfg.interpolation
        if mode not in ("shortest", "squash", "longest"):
            raise OutputError(
                f"{self.ref}: preprocess_cfg resize_mode {mode!r} is not one the serving "
                "contract describes",
                "use shortest, longest or squash, or export formats: [safetensors]",
            )
        if interpolation not in ("bicubic", "bilinear", "nearest"):
            raise OutputError(
                f"{self.ref}: preprocess_cfg interpolation {interpolation!r} is not one the "
                "serving contract describes",
                "use bicubic, bilinear or nearest",
            )
        crop = {"height": height, "width": width, "offset": "round_half_even"}
        if mode == "squash":
            resize: dict[str, Any] = {"height": height, "width": width}
        elif mode == "shortest" and height == width:
            resize = {"shortest_edge": height}
        else:  # ResizeKeepRatio: the scale that fits the longer (or shorter) side, then pad or crop
            fit = "longest" if mode == "longest" else "shortest"
            resize = {"keep_ratio": {"height": height, "width": width, "fit": fit}}
            crop["fill"] = int(cfg.fill_color)
        return image_record(
            input_name="pixel_values",
            resize=resize,
            interpolation=interpolation,
            center_crop=None if mode == "squash" else crop,
            rescale=1 / 255,
            mean=list(cfg.mean),
            std=list(cfg.std),
        )

    def load_snippet(self, folder: str) -> str:
        return (
            f"import open_clip\n"
            f'model, _, preprocess = open_clip.create_model_and_transforms("local-dir:{folder}")\n'
            f'tokenizer = open_clip.get_tokenizer("local-dir:{folder}")'
        )

    def save_native(self, folder: Path) -> str:
        import open_clip

        # An HF tokenizer is the folder's own, as open_clip loads it; the bundled one ships with open_clip.
        hf_tokenizer = (
            self.tokenizer.tokenizer
            if isinstance(self.tokenizer, open_clip.tokenizer.HFTokenizer)
            else None
        )
        write_local_dir(folder, self.model, self.config, hf_tokenizer)
        return "open_clip:local-dir"


def _lora_targets(model: Any) -> dict[str, Any]:
    """What a LoRA adapts in this image tower. A ViT's attention is nn.MultiheadAttention with
    one fused in_proj_weight (q, k and v stacked), so peft adapts that parameter whole: a rank-r
    update of the in-projection rather than of q and v alone. A ModifiedResNet has attention
    only in its pooling head, which passes q_proj.weight straight to F.multi_head_attention_forward
    and so bypasses a peft wrapper (the adapter would train nothing): there the LoRA adapts the
    last stage's convolutions (their residual branch starts at zero gain: bn3 is zero-initialised).
    A timm tower with separate q/v projections gets those; EVA's fused qkv goes through F.linear
    with split biases, which bypasses a wrapper too, so there the LoRA adapts attention's output
    projection."""
    names = [name for name, _ in model.named_modules()]
    if any(name.startswith("visual.transformer.resblocks.") for name in names):
        return {
            "target_modules": [],
            "target_parameters": sorted(
                f"{name}.in_proj_weight"
                for name, module in model.named_modules()
                if name.startswith("visual.transformer.")
                and isinstance(module, torch.nn.MultiheadAttention)
            ),
        }
    # timm
    if any(name.startswith("visual.trunk.") and name.endswith(".attn.q_proj") for name in names):
        return {"target_modules": r".*visual\.trunk\..*\.attn\.(q_proj|v_proj)"}
    if any(name.startswith("visual.trunk.") and name.endswith(".attn.proj") for name in names):
        return {"target_modules": r".*visual\.trunk\..*\.attn\.proj"}
    return {"target_modules": r".*visual\.layer4\..*\.conv[123]"}


def _get(module: Any, path: str) -> Any:
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return None
    return module


def _tokenizer(rest: str, folder: Path, model_cfg: dict[str, Any]) -> Any:
    """The tokenizer open_clip itself pairs with this checkpoint. A text_cfg naming an HF tokenizer
    (SigLIP, mT5, ..., or the tiny vocabulary) needs that tokenizer's files: a local folder
    carries them (open_clip's get_tokenizer then reads the folder, offline); a bare weights file
    does not, and the bundled SimpleTokenizer would feed its tower the wrong ids. Any other
    gets the bundled 49,408-token SimpleTokenizer."""
    import open_clip

    text_cfg = model_cfg.get("text_cfg", {})
    context_length = text_cfg.get("context_length", open_clip.tokenizer.DEFAULT_CONTEXT_LENGTH)
    if not text_cfg.get("hf_tokenizer_name"):
        return open_clip.SimpleTokenizer(context_length=context_length)
    if not rest.startswith("local-dir:"):
        raise ModelError(
            f"open_clip:{rest}: its text tower reads the tokenizer {text_cfg['hf_tokenizer_name']!r}, "
            "which ptc never downloads",
            "load a folder holding the model and its tokenizer as open_clip:local-dir:FOLDER",
        )
    try:
        # trust_remote_code=False overrides any text_cfg.tokenizer_kwargs the config carries.
        return open_clip.get_tokenizer(
            f"local-dir:{folder}", context_length=context_length, trust_remote_code=False
        )
    except (OSError, ValueError) as exc:
        raise ModelError(
            f"open_clip:{rest}: text_cfg names a tokenizer but {folder} holds none that loads: "
            f"{exc}".split("\n")[0],
            "save the tokenizer into the folder (save_pretrained)",
        ) from None


def _vocab_size(tokenizer: Any) -> int:
    # SimpleTokenizer's; an HFTokenizer wraps a transformers one
    encoder = getattr(tokenizer, "encoder", None)
    return len(encoder) if encoder is not None else len(tokenizer.tokenizer)


def add_tower_hook(hook: Callable[[], None]) -> None:
    """Run `hook()` before open_clip builds a model (a plugin registering its timm towers)."""
    TOWER_HOOKS.append(hook)


def _run_tower_hooks() -> None:
    while TOWER_HOOKS:
        TOWER_HOOKS.pop(0)()


def write_local_dir(folder: Path, model: Any, config: dict[str, Any], hf_tokenizer: Any) -> None:
    """The local-dir layout open_clip's own loader reads: weights (without the attention masks,
    which the model rebuilds), config, and an HF tokenizer's files when the model has one."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items() if "attn_mask" not in k},
        str(folder / WEIGHTS),
        metadata={"format": "pt"},
    )
    (folder / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True))
    if hf_tokenizer is not None:
        save_tokenizer(hf_tokenizer, folder)


def check(rest: str, base_dir: Path) -> str:
    return _resolve(rest, base_dir)[2]


register_scheme("open_clip", OpenClip.load, check)
