"""The recipe schema: what to build. How to run it (bank, device, output override) lives
in `options.py`; resolving the recipe against the bank is `build.plan`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import pydantic

from .errors import RecipeError
from .grid import NAME_PATTERN
from .yamlio import load_yaml, validate

MAX_ABS_WEIGHT = 100.0
FORMATS = ("onnx", "safetensors")  # the default; "triton" is also accepted


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


class Term(_Strict):
    task: str = pydantic.Field(pattern=NAME_PATTERN)
    source: str = pydantic.Field(pattern=NAME_PATTERN, description="descriptor id in the bank")
    weight: float

    @pydantic.field_validator("weight", mode="before")
    @classmethod
    def _weight(cls, value):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected a number")
        value = _finite(float(value))
        if value == 0 or abs(value) > MAX_ABS_WEIGHT:
            raise ValueError(f"expected a non-zero weight with |weight| <= {MAX_ABS_WEIGHT:g} "
                             "(the paper uses 0.5 to add and -0.5 or -1 to negate)")
        return value


def _positive_finite(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("expected a number")
    value = _finite(float(value))
    if value <= 0:
        raise ValueError("expected a positive number")
    return value


class Solve(_Strict):
    ridge: float = 1.0  # lam = ridge * mean squared singular value, for images and prompts

    _ridge = pydantic.field_validator("ridge", mode="before")(lambda cls, v: _positive_finite(v))


class Verify(_Strict):
    linearity_rtol: float = 1e-6  # at the float32 precision operators are stored in
    linearity_rtol_fp64: float = 1e-12
    equivalence_atol: float = 1e-5
    fp16_min_cosine: float = 0.999  # fp16 ONNX towers against the fp32 ones, per output row
    # Relative descriptor residual ||S_edit - S_pre - sum w U|| / ||sum w U|| per grid; None
    # reports it without a limit.
    max_descriptor_residual: float | None = None
    check_inputs: int = pydantic.Field(default=16, ge=2, le=4096)

    _tolerances = pydantic.field_validator(
        "linearity_rtol", "linearity_rtol_fp64", "equivalence_atol", "max_descriptor_residual", mode="before"
    )(lambda cls, v: v if v is None else _positive_finite(v))


class Adapter(_Strict):
    """`route: adapter` settings; defaults are the paper's (rank 16, 20 epochs, <= 540 steps)."""

    rank: int = pydantic.Field(default=16, ge=1, le=512)
    alpha: float | None = None  # None: peft's default lora_alpha
    epochs: int = pydantic.Field(default=20, ge=1)
    max_steps: int = pydantic.Field(default=540, ge=1)
    lr: float = 1e-3
    batch_size: int = pydantic.Field(default=32, ge=1)
    seed: int = 42

    _lr = pydantic.field_validator("lr", mode="before")(lambda cls, v: _positive_finite(v))


class Triton(_Strict):
    max_batch_size: int = pydantic.Field(default=64, ge=1)


class Export(_Strict):
    out: str | None = None
    formats: tuple[Literal["onnx", "safetensors", "triton"], ...] = FORMATS
    precision: tuple[Literal["fp32", "fp16"], ...] = ("fp32",)  # fp16: extra *_fp16.onnx towers, fp32 I/O
    triton: Triton = Triton()

    @pydantic.field_validator("formats", "precision", mode="before")
    @classmethod
    def _non_empty(cls, value, info):
        if isinstance(value, list):
            if not value:
                raise ValueError(f"expected a non-empty list for {info.field_name}")
            return tuple(value)
        return value

    @pydantic.model_validator(mode="after")
    def _needs_onnx(self):
        if "onnx" not in self.formats and ("triton" in self.formats or "fp16" in self.precision):
            raise ValueError("'triton' and fp16 precision are made from the ONNX towers: add 'onnx' to formats")
        if "fp32" not in self.precision:
            raise ValueError("precision must include fp32 (the fp16 towers are verified against it)")
        return self


class Recipe(_Strict):
    target: str = pydantic.Field(min_length=1, description="model reference, e.g. hf:/models/clip")
    terms: tuple[Term, ...] = pydantic.Field(min_length=1)
    route: Literal["closed_form", "adapter"] = "closed_form"
    solve: Solve = Solve()
    adapter: Adapter = Adapter()
    verify: Verify = Verify()
    export: Export = Export()
    bank: str | None = None
    # Held-out zero-shot accuracy before and after the edit: task name -> a labelled folder
    # (DIR/<class>/*, relative to the recipe). Tasks need not be terms (a control task is not).
    evaluate: dict[str, str] = {}

    @pydantic.field_validator("terms", mode="before")
    @classmethod
    def _terms(cls, value):
        return tuple(value) if isinstance(value, list) else value


def load_recipe(path: Path) -> Recipe:
    path = Path(path)
    data, locate = load_yaml(path, RecipeError)
    recipe = validate(Recipe, data, path, locate, RecipeError)
    seen: set[tuple[str, str]] = set()
    for index, term in enumerate(recipe.terms):
        key = (term.task, term.source)
        if key in seen:
            line = locate(("terms", index))
            raise RecipeError(f"{path}:{line}: terms[{index}]: task {term.task!r} from source "
                              f"{term.source!r} appears twice", "merge the two terms into one weight")
        seen.add(key)
    return recipe
