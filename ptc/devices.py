"""Where forward passes run and in what precision (`--device`, `--precision`).

The heavy passes (every probe of a grid, every prompt, held-out and certification data) run
on the chosen device, optionally under autocast in bf16 or fp16. A reduced precision changes
the embeddings, so it is part of the bank's cache key (an fp32 entry is never read for a bf16
build, nor the reverse) and every embedding entry records the device and precision that made
it. Verification and export always run in fp32 on the CPU: the small check batch is the
reference that every shipped figure is compared against, and ONNX is exported from it.
"""

from __future__ import annotations

import platform
import weakref
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch

from ptc.errors import InputError
from ptc.memory import page_out

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
CPU = torch.device("cpu")


# The instruction sets that decide an fp32 or bf16 speed figure on a CPU. A model name alone
# does not: "AMD EPYC" named both a 2-core machine without AVX-512 (bf16 at a sixth of fp32's
# speed) and one with AVX-512 bf16 (bf16 1.4x onnxruntime fp32 at ViT-L/14; benchmarks/README.md).
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_name(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """What a speed figure was measured on: the CPU's model name, family and model as Linux
    gives them, and which of SPEED_FLAGS it has; elsewhere what the platform module knows."""
    try:
        with cpuinfo.open(encoding="utf-8") as handle:
            fields = _first_cpu(handle)
    except OSError:
        fields = {}
    if "model name" not in fields:
        return platform.processor() or platform.machine()
    flags = set(fields.get("flags", "").split())
    isa = ", ".join(flag for flag in SPEED_FLAGS if flag in flags) or "no AVX2"
    family = f"family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}"
    return f"{fields['model name']} ({family}; {isa})"


def _first_cpu(lines: Iterable[str]) -> dict[str, str]:
    """The first processor's `key: value` fields of /proc/cpuinfo."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


class Placed(Protocol):
    """What runs on a device: a model that says where it is and moves (a family's encoder)."""

    @property
    def device(self) -> torch.device: ...

    def to_device(self, device: torch.device) -> None: ...


PlacedT = TypeVar("PlacedT", bound=Placed)

_PRECISION: weakref.WeakKeyDictionary[object, str] = weakref.WeakKeyDictionary()


def resolve_device(text: str = "auto") -> torch.device:
    """`auto` (the first GPU when there is one, else the CPU), `cpu`, `cuda` or `cuda:N`; a
    device this machine does not have is an InputError naming what it has."""
    if text == "auto":
        return torch.device("cuda") if torch.cuda.is_available() else CPU
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise InputError(
            f"--device {text}: expected auto, cpu, cuda or cuda:N", "run with --device auto"
        )
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            raise InputError(
                f"--device {text}: this machine has {count} CUDA device(s) usable by torch "
                f"{torch.__version__}",
                "run with --device auto or --device cpu",
            )
    return device


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise InputError(
            f"--precision {precision}: expected one of {', '.join(PRECISIONS)}",
            "the default is fp32",
        )
    return precision


def place(model: PlacedT, device: torch.device, precision: str = "fp32") -> PlacedT:
    """`model` moved to `device`, its embedding passes to run in `precision`; returns it."""
    check_precision(precision)
    if device.type == "cuda":
        # fp32 means fp32: TF32 matmuls and convolutions would move embeddings by ~1e-3.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model.to_device(device)
    _PRECISION[model] = precision
    return model


@dataclass(frozen=True)
class Compute:
    """`--device` and `--precision` as given: resolved where the passes run (a Ray worker
    resolves `auto` on its own machine)."""

    device: str = "auto"
    precision: str = "fp32"

    def resolved(self) -> torch.device:
        return resolve_device(self.device)

    def place(self, model: PlacedT) -> PlacedT:
        return place(model, self.resolved(), self.precision)


def precision_of(model: Placed) -> str:
    """The precision `place` gave this model's embedding passes (fp32 unless placed otherwise)."""
    return _PRECISION.get(model, "fp32")


def autocast(model: Placed) -> AbstractContextManager[Any]:
    """The context its embedding passes run in: autocast to its precision, or nothing for fp32."""
    precision = precision_of(model)
    if precision == "fp32":
        return nullcontext()
    return torch.autocast(device_type=model.device.type, dtype=PRECISIONS[precision])


def device_label(device: torch.device) -> str:
    """What a record says a pass ran on: 'cpu', or 'cuda: <the GPU's name>'."""
    device = torch.device(device)
    return f"cuda: {torch.cuda.get_device_name(device)}" if device.type == "cuda" else device.type


@contextmanager
def on_device(models: Sequence[Placed], device: torch.device) -> Iterator[None]:
    """Run a block with `models` on `device`, then move them back to the CPU (where the
    verification and export that follow run)."""
    for model in models:
        model.to_device(device)
    try:
        yield
    finally:
        for model in models:
            model.to_device(CPU)


def page_out_weights(module: torch.nn.Module) -> None:
    """Let the module's weights leave resident memory where they map an unchanged checkpoint
    (ptc/memory.py `page_out`), for a stretch in which another runtime runs the same weights:
    they are read back from the file when torch next runs the module."""
    page_out(
        [
            (t.data_ptr(), t.numel() * t.element_size())
            for t in [*module.parameters(), *module.buffers()]
            if t.device.type == "cpu" and t.is_contiguous()
        ]
    )
