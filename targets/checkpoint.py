"""A checkpoint is what its config says, or it is refused.

Libraries build the model a config describes and copy a checkpoint's tensors into it: weights
the config does not build are dropped, weights it builds that the files lack keep their random
initialisation, and a config that declares a far larger model allocates it before anything
compares. So every loader here first builds the model on the meta device (no memory), holds its
size to the tensors the files hold and to the machine, and after loading refuses any weight
that is missing, unexpected or of another shape, naming the first and the count. Every tensor
that was read is checked finite too, so nothing of a damaged folder is ever used.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from ptc.errors import ModelError
from ptc.finite import NonFiniteError, first_non_finite

MISMATCH_HINT = (
    "the config and the weights must come from the same model: save both with the library's own "
    "save_pretrained (open_clip: its local-dir layout)"
)
# A config may build a few small tensors its files leave out (tied weights, buffers that older
# checkpoints stored and newer code recomputes); a config that builds more than twice what the
# files hold is another model.
DECLARED_SLACK = 2.0


@dataclass(frozen=True)
class StoredTensors:
    """What a checkpoint's safetensors files hold, read off their headers (no tensor data)."""

    shapes: dict[str, tuple[int, ...]]
    files: dict[str, Path]  # tensor name -> the file that holds it

    @property
    def values(self) -> int:
        return sum(math.prod(shape) for shape in self.shapes.values())


def stored_tensors(files: list[Path]) -> StoredTensors:
    from safetensors import safe_open

    shapes, where = {}, {}
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():
                shapes[name] = tuple(handle.get_slice(name).get_shape())
                where[name] = path
    return StoredTensors(shapes, where)


def declared_shapes(build: Callable[[], torch.nn.Module]) -> dict[str, tuple[int, ...]]:
    """The state dict's shapes of the model `build()` makes, made on the meta device."""
    with torch.device("meta"):
        module = build()
    return {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}


def build_assigned(
    build: Callable[[], torch.nn.Module], state: dict[str, torch.Tensor], ref: str
) -> torch.nn.Module:
    """The model `build()` makes, its parameters the checkpoint's own tensors: built with its
    parameters on the meta device (no memory, no random initialisation), then assigned `state`
    (cast to the dtype the model declares). Buffers are made as the model makes them, so those
    a checkpoint leaves out (open_clip's attention masks) hold their computed values. Building
    the model for real and copying into it held it twice at the peak and spent a full random
    initialisation (ViT-H/14: 3.9 GB and about 20 s on 2 cores)."""
    with parameters_on_meta():
        module = build()
    declared = module.state_dict()
    state = {
        name: tensor.to(declared[name].dtype) if name in declared else tensor
        for name, tensor in state.items()
    }
    module.load_state_dict(state, strict=False, assign=True)
    left = [name for name, p in module.named_parameters() if p.is_meta]
    if left:
        raise ModelError(
            f"{ref}: the checkpoint holds no tensor {left[0]!r} ({len(left)} parameters missing)",
            MISMATCH_HINT,
        )
    return module


@contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside put each parameter on the meta device as it is registered; their
    buffers stay real."""
    register = torch.nn.Module.register_parameter

    def on_meta(module: torch.nn.Module, name: str, param: torch.nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None:
            kind = type(param)
            module._parameters[name] = kind(param.to("meta"), requires_grad=param.requires_grad)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def _gb(nbytes: float) -> str:
    return f"{nbytes / 1e9:.2f} GB"


def available_memory() -> int | None:
    """Bytes this machine can still allocate (MemAvailable), or None where it cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def require_plausible_size(
    declared: dict[str, tuple[int, ...]], stored: StoredTensors, ref: str, config: str
) -> None:
    """Refuse, before anything is allocated, a config that builds far more than its files hold
    or more than this machine has (float32: four bytes a value)."""
    values = sum(math.prod(shape) for shape in declared.values())
    if values > DECLARED_SLACK * stored.values + 1_000_000:
        raise ModelError(
            f"{ref}: {config} declares a model of {values:,} values ({_gb(4 * values)}) but its "
            f"weights hold {stored.values:,}; refused before loading",
            MISMATCH_HINT,
        )
    free = available_memory()
    if free is not None and 4 * values > free:
        raise ModelError(
            f"{ref}: {config} declares a model of {_gb(4 * values)}, more than the "
            f"{_gb(free)} this machine has free; refused before loading",
            "free memory, or build on a larger machine",
        )


def describe_mismatch(
    ref: str,
    config: str,
    missing: list[str],
    unexpected: list[str],
    mismatched: list[tuple[str, tuple, tuple]],
    stored: StoredTensors,
    missing_effect: str = "they would be left random",
) -> ModelError | None:
    """One line for the first disagreement between a config and its checkpoint (None: agree)."""
    if mismatched:
        name, in_file, built = mismatched[0]
        return ModelError(
            f"{ref}: {len(mismatched)} weight(s) have another shape than {config} builds "
            f"(first: {name!r} is {list(in_file)} in {stored.files.get(name, 'the checkpoint')}, "
            f"the config builds {list(built)})",
            MISMATCH_HINT,
        )
    if missing:
        return ModelError(
            f"{ref}: {len(missing)} weight(s) that {config} builds are not in the "
            f"checkpoint (first: {sorted(missing)[0]!r}); {missing_effect}",
            MISMATCH_HINT,
        )
    if unexpected:
        first = sorted(unexpected)[0]
        return ModelError(
            f"{ref}: {len(unexpected)} weight(s) in the checkpoint are not part of what "
            f"{config} builds (first: {first!r} in {stored.files.get(first, 'the checkpoint')}); "
            "they would be dropped",
            MISMATCH_HINT,
        )
    return None


def require_matching(
    declared: dict[str, tuple[int, ...]],
    stored: StoredTensors,
    ref: str,
    config: str,
    ignore: Callable[[str], bool] = lambda name: False,
    missing_effect: str = "they would be left random",
) -> None:
    """Every tensor the config builds is stored with its shape, and nothing else is stored."""
    missing = [name for name in declared if name not in stored.shapes and not ignore(name)]
    unexpected = [name for name in stored.shapes if name not in declared and not ignore(name)]
    mismatched = [
        (name, stored.shapes[name], declared[name])
        for name in sorted(declared)
        if name in stored.shapes and stored.shapes[name] != declared[name]
    ]
    problem = describe_mismatch(
        ref, config, missing, unexpected, mismatched, stored, missing_effect
    )
    if problem is not None:
        raise problem


NON_FINITE_HINT = (
    "the checkpoint is damaged (or was saved from a diverged training run); ptc uses no weight "
    "that is NaN or Inf"
)


def require_finite_weights(module: torch.nn.Module, ref: str, stored: StoredTensors) -> None:
    """Every loaded weight finite; the error names the file that held the bad tensor."""
    found = first_non_finite(module.state_dict())
    if found is not None:
        name, bad, total = found
        raise NonFiniteError(
            f"{ref}: {stored.files.get(name, 'the checkpoint')}: tensor {name!r} holds NaN or Inf "
            f"({bad:,} of {total:,} values)",
            NON_FINITE_HINT,
        )
