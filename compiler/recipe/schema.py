"""The recipe schema: what to build. How to run it (bank, device, output override) lives
in `options.py`; resolving the recipe against the bank is `build.plan`."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

import pydantic

from ptc.compiler.tasks.grid import NAME_PATTERN
from ptc.errors import RecipeError
from ptc.strict_yaml import PathText, load_yaml, validate

MAX_ABS_WEIGHT = 100.0
FORMATS: tuple[Literal["onnx", "safetensors", "triton"], ...] = (
    "onnx",
    "safetensors",
)  # the default; "triton" is also accepted
# The build routes, named once: compiler/edit/routes.py implements each as the function of that name.
RouteName = Literal["closed_form", "adapter"]


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ValueError("expected a finite number")
    return value


MAX_SOURCES = 16


def _as_tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


class Term(_Strict):
    """One signed task term. `source` names one descriptor of the task, or several: then the
    term's descriptor is their consensus (`combine`), weighted by `source_weights`: by default
    each source's agreement with the target (descriptor.agreement_weights), or `uniform`, or
    numbers.
    `kind: relative` reads each source as the answers its fine-tune gives, in the target's
    affinity scale, minus the target's own: see descriptor.relative_descriptor."""

    task: str = pydantic.Field(pattern=NAME_PATTERN)
    source: tuple[str, ...] = pydantic.Field(
        description="descriptor id(s) in the bank; one may be written bare"
    )
    # None: `agreement` where weights apply (mean, normalised), none for a median
    source_weights: tuple[float, ...] | Literal["agreement", "uniform"] | None = None
    # normalised beat mean and median on the zoo's train split for both descriptor kinds
    combine: Literal["mean", "normalised", "median"] = "normalised"
    kind: Literal["difference", "relative"] = "difference"
    weight: float

    @pydantic.field_validator("source_weights", mode="before")
    @classmethod
    def _weights_shape(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in ("agreement", "uniform"):
            raise ValueError(
                f"expected agreement, uniform or a list of positive numbers, not {value!r}"
            )
        return _as_tuple(value)

    @pydantic.field_validator("source", mode="before")
    @classmethod
    def _source_ids(cls, value: Any) -> Any:
        ids = (value,) if isinstance(value, str) else _as_tuple(value)
        if not isinstance(ids, tuple) or not all(isinstance(i, str) for i in ids):
            raise ValueError("expected a descriptor id or a list of them")
        if not 1 <= len(ids) <= MAX_SOURCES:
            raise ValueError(f"expected 1 to {MAX_SOURCES} descriptor ids")
        for descriptor_id in ids:
            if not re.match(NAME_PATTERN, descriptor_id):
                raise ValueError(
                    f"descriptor id {descriptor_id!r} is not valid (letters, digits, '.', '_', '-')"
                )
        if len(set(ids)) != len(ids):
            raise ValueError(
                f"descriptor ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}"
            )
        return ids

    @pydantic.field_validator("source_weights", mode="after")
    @classmethod
    def _source_weights(cls, value: Any) -> Any:
        if isinstance(value, tuple) and not all(math.isfinite(w) and w > 0 for w in value):
            raise ValueError("expected positive finite numbers (they are normalised to sum to 1)")
        return value

    @pydantic.field_validator("weight", mode="before")
    @classmethod
    def _weight(cls, value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("expected a number")
        value = _finite(float(value))
        if value == 0 or abs(value) > MAX_ABS_WEIGHT:
            raise ValueError(
                f"expected a non-zero weight with |weight| <= {MAX_ABS_WEIGHT:g} "
                "(the paper uses 0.5 to add and -0.5 or -1 to negate)"
            )
        return value

    @pydantic.model_validator(mode="after")
    def _consensus(self) -> Term:
        if self.source_weights is not None:
            if isinstance(self.source_weights, str):
                if self.combine == "median" and self.source_weights == "agreement":
                    raise ValueError(
                        "source_weights: agreement cannot weight a median; use combine: mean or normalised"
                    )
            elif len(self.source_weights) != len(self.sources):
                raise ValueError(
                    f"source_weights has {len(self.source_weights)} numbers for "
                    f"{len(self.sources)} sources"
                )
            if self.combine == "median":
                raise ValueError(
                    "source_weights cannot weight a median; use combine: mean or normalised"
                )
        return self

    @property
    def sources(self) -> tuple[str, ...]:
        return self.source

    @property
    def weighting(self) -> str | None:
        """How a consensus weighs its sources: "agreement", "uniform", "explicit", or None
        (one source, or a median)."""
        if len(self.sources) == 1 or self.combine == "median":
            return None
        if isinstance(self.source_weights, tuple):
            return "explicit"
        return self.source_weights or "agreement"

    @property
    def label(self) -> str:
        """How reports name the term's source: the id, or `a+b+c` for a consensus."""
        return "+".join(self.sources) + (" (relative)" if self.kind == "relative" else "")


def _positive_finite(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("expected a number")
    value = _finite(float(value))
    if value <= 0:
        raise ValueError("expected a positive number")
    return value


class Solve(_Strict):
    ridge: float = 1.0  # lam = ridge * mean squared singular value, for images and prompts

    _ridge = pydantic.field_validator("ridge", mode="before")(lambda cls, v: _positive_finite(v))


class Strength(_Strict):
    """How term weights are set. `fixed`: as written. `auto`: each term keeps its sign and its
    magnitude is chosen without labels (compiler/edit/strength.py): the weights that best reproduce
    every term's descriptor on probes held out of the solve, while the predicted movement of
    control grids (tasks that are no term's) is penalised with `control_weight`."""

    mode: Literal["fixed", "auto"] = "fixed"
    control: tuple[str, ...] | None = None  # control tasks; None: every bank task that is no term's
    control_weight: float = 1.0  # 1.0 chosen on the zoo's train split (results/paper-full.md)
    max_weight: float = 1.0
    folds: int = pydantic.Field(default=4, ge=2, le=16)

    _control = pydantic.field_validator("control", mode="before")(lambda cls, v: _as_tuple(v))
    _positive = pydantic.field_validator("control_weight", "max_weight", mode="before")(
        lambda cls, v: _positive_finite(v)
    )


class Verify(_Strict):
    linearity_rtol: float = 1e-6  # at the float32 precision operators are stored in
    linearity_rtol_fp64: float = 1e-12
    equivalence_atol: float = 1e-5
    fp16_min_cosine: float = 0.999  # fp16 ONNX towers against the fp32 ones, per output row
    int8_min_cosine: float = 0.99  # int8 ONNX towers against the fp32 ones, per output row
    # zero-shot top-1 of the int8 input tower against the fp32 one on the check inputs, with
    # each term's class prompts
    int8_min_top1_agreement: float = pydantic.Field(default=1.0, ge=0.0, le=1.0)
    # Relative descriptor residual ||S_edit - S_pre - sum w U|| / ||sum w U|| per grid; None
    # reports it without a limit.
    max_descriptor_residual: float | None = None
    check_inputs: int = pydantic.Field(default=8, ge=2, le=4096)
    # The composition certificate (compiler/verify/certify.py) per task: a folder of inputs (labels
    # not needed, relative to the recipe). The build fails if a certified prediction changes.
    certify: dict[str, PathText] = {}

    _tolerances = pydantic.field_validator(
        "linearity_rtol",
        "linearity_rtol_fp64",
        "equivalence_atol",
        "max_descriptor_residual",
        mode="before",
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
    out: PathText | None = None
    formats: tuple[Literal["onnx", "safetensors", "triton"], ...] = FORMATS
    # fp16: extra *_fp16.onnx towers, fp32 I/O; int8: *_int8.onnx, weights quantised for CPUs
    precision: tuple[Literal["fp32", "fp16", "int8"], ...] = ("fp32",)
    triton: Triton = Triton()

    @pydantic.field_validator("formats", "precision", mode="before")
    @classmethod
    def _non_empty(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        if isinstance(value, list):
            if not value:
                raise ValueError(f"expected a non-empty list for {info.field_name}")
            return tuple(value)
        return value

    @pydantic.model_validator(mode="after")
    def _needs_onnx(self) -> Export:
        reduced = [p for p in self.precision if p != "fp32"]
        if "onnx" not in self.formats and ("triton" in self.formats or reduced):
            raise ValueError(
                "'triton' and fp16 or int8 precision are made from the ONNX towers: add 'onnx' "
                "to formats"
            )
        if "fp32" not in self.precision:
            raise ValueError(
                "precision must include fp32 (the fp16 and int8 towers are verified against it)"
            )
        return self


class Recipe(_Strict):
    target: PathText = pydantic.Field(
        min_length=1, description="model reference, e.g. hf:/models/clip"
    )
    terms: tuple[Term, ...] = pydantic.Field(min_length=1)
    route: RouteName = "closed_form"
    solve: Solve = Solve()
    strength: Strength = Strength()
    adapter: Adapter = Adapter()
    verify: Verify = Verify()
    export: Export = Export()
    bank: PathText | None = None
    # Held-out zero-shot accuracy before and after the edit: task name -> a labelled folder
    # (DIR/<class>/*, relative to the recipe). Tasks need not be terms (a control task is not).
    evaluate: dict[str, PathText] = {}

    @pydantic.field_validator("terms", mode="before")
    @classmethod
    def _terms(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @pydantic.field_validator("strength", mode="before")
    @classmethod
    def _strength_shorthand(cls, value: Any) -> Any:
        return {"mode": value} if isinstance(value, str) else value


def load_recipe(path: Path) -> Recipe:
    path = Path(path)
    data, locate = load_yaml(path, RecipeError)
    recipe = validate(Recipe, data, path, locate, RecipeError)
    seen: set[tuple[str, str]] = set()
    for index, term in enumerate(recipe.terms):
        key = (term.task, term.label)
        if key in seen:
            line = locate(("terms", index))
            raise RecipeError(
                f"{path}:{line}: terms[{index}]: task {term.task!r} from source "
                f"{term.label!r} appears twice",
                "merge the two terms into one weight",
            )
        seen.add(key)
    return recipe
