"""ONNX towers at the cost of what an edit changed.

Exporting a real-size tower takes tens of seconds (the tracer and the exporter walk the
whole graph) while a closed-form edit changes one initializer of it. So each base tower is
exported once per model and exporter version into the bank (`exports/<key>/<tower>.onnx`),
and a build writes an edited tower by loading that graph and replacing the initializers of
the parameters the edit changed: an unchanged tower (the text tower of an image edit) is the
cached graph as it is. A parameter that cannot be found in the graph as itself (same name,
shape and bytes) falls back to a fresh export of the edited tower. Either way the build then
checks the written graph against torch, so a damaged cache cannot ship.

Towers whose weights exceed protobuf's 2 GiB message limit are written with their tensors in
one external data file beside the graph (`<tower>.onnx.data`).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from itertools import chain
from pathlib import Path

import numpy as np
import torch

from ..targets.base import OnnxTower

from . import __version__
from ..errors import BankError
from .bank import Bank
from .fsio import file_lock

# protobuf refuses messages over 2 GiB; the graph itself needs room beside the weights.
EXTERNAL_DATA_BYTES = 1_800_000_000


def tower_bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in chain(module.parameters(), module.buffers()))


def save_onnx(model, path: Path, external: bool) -> None:
    """Save a graph; with `external`, every tensor over 1 KiB goes to `<name>.data` beside it."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    if external:
        onnx.save(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                  location=f"{path.name}.data", size_threshold=1024)
    else:
        onnx.save(model, str(path))


def onnx_files(path: Path) -> list[Path]:
    """The graph and, where it has one, its external data file."""
    data = path.with_name(f"{path.name}.data")
    return [path, data] if data.is_file() else [path]


def export_key(model_key: str, tower: OnnxTower) -> str:
    """What an exported graph depends on: the model (both fingerprints), the tower and its
    example input shapes, and the versions of everything that writes the graph."""
    import onnx
    import onnxscript

    from .export import ONNX_OPSET

    shapes = sorted((name, tuple(t.shape), str(t.dtype)) for name, t in tower.example_inputs.items())
    text = "|".join(map(str, (model_key, tower.name, shapes, __version__, torch.__version__, onnx.__version__,
                              onnxscript.__version__, ONNX_OPSET)))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def cached_base(bank: Bank, key: str, tower: OnnxTower) -> Path:
    """The base tower's graph in the bank, exported (stack traces stripped) on first use and
    sealed with its files' hashes, which every use checks. Concurrent builds export it once:
    the second waits on the lock and finds it written."""
    from .export import export_onnx, load_stripped

    path = bank.export_folder(key) / f"{tower.name}.onnx"
    if _intact(bank, key, tower.name):
        return path
    bank.prepare_export(key)
    with file_lock(bank.root / ".locks" / f"export-{key}-{tower.name}.lock"):
        if _intact(bank, key, tower.name):
            return path
        bank.scratch.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=bank.scratch, prefix=f".export-{key}.{os.getpid()}.") as folder:
            exported = Path(folder) / "exported" / path.name
            export_onnx(tower, exported)
            written = Path(folder) / path.name
            save_onnx(load_stripped(exported), written, tower_bytes(tower.module) > EXTERNAL_DATA_BYTES)
            path.parent.mkdir(parents=True, exist_ok=True)
            for file in reversed(onnx_files(written)):
                os.replace(file, path.parent / file.name)
        bank.seal_export(key, tower.name, onnx_files(path))  # the record last: its presence means complete
    return path


def _intact(bank: Bank, key: str, tower: str) -> bool:
    """True for a complete, intact export; False for none (or one a crash left unsealed); a
    sealed export that no longer matches its record is a BankError, as any damaged entry."""
    problem = bank.export_problem(key, tower)
    if problem is None:
        return True
    if (bank.export_folder(key) / f"{tower}.json").exists():
        raise BankError(problem, f"delete {bank.export_folder(key)} (the next build exports it again), "
                                 f"or run `ptc bank verify --bank {bank.root}`")
    return False


def changed_tensors(base: torch.nn.Module, edited: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (base tensor, edited tensor)} of the tensors the edit replaced. An edit shares every
    tensor it did not change with its base (targets.base.copy_sharing), so identity says which."""
    def named(module):
        return dict(chain(module.named_parameters(remove_duplicate=False), module.named_buffers(remove_duplicate=False)))

    before = named(base)
    return {name: (before[name], tensor) for name, tensor in named(edited).items()
            if name not in before or tensor is not before[name]}


def patch_initializers(model, changed: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> int | None:
    """Write each changed tensor into the graph in place; return how many initializers changed.

    A tensor is found under its own name, else by value: the exporter stores some weights
    pre-transposed under a generated name (SigLIP's head MLP). One the graph does not hold at
    all (the image projection, in the text tower's graph) is unused by it. None, the graph
    untouched, where that cannot be told (another shape or other bytes under its name, or
    values so uniform that matching them by value would be a guess)."""
    from onnx import numpy_helper

    by_name = {init.name: init for init in model.graph.initializer}
    updates = []
    for name, (before, after) in changed.items():
        old = before.detach().cpu().numpy()
        new = np.ascontiguousarray(after.detach().cpu().numpy())
        init = by_name.get(name)
        if init is not None:
            held = numpy_helper.to_array(init)
            if held.shape != old.shape or held.dtype != new.dtype or not np.array_equal(held, old):
                return None
            updates.append((init, new))
            continue
        copies = _copies(model, old)
        if copies is None:
            return None
        updates.extend((init, np.ascontiguousarray(new.T) if transposed else new) for init, transposed in copies)
    if any(not init.HasField("raw_data") for init, _ in updates):
        return None
    for init, value in updates:
        init.raw_data = value.tobytes()
    return len(updates)


def _copies(model, values: np.ndarray) -> list[tuple[object, bool]] | None:
    """Initializers holding `values` as they are or transposed: [(initializer, transposed)];
    None where a match would be a guess (every value the same)."""
    from onnx import numpy_helper

    found = []
    for init in model.graph.initializer:
        if int(np.prod(init.dims)) != values.size:
            continue
        held = numpy_helper.to_array(init)
        if held.dtype != values.dtype:
            continue
        if held.shape == values.shape and np.array_equal(held, values):
            found.append((init, False))
        elif values.ndim == 2 and held.shape == values.T.shape and np.array_equal(held, values.T):
            found.append((init, True))
    if found and (values.size <= 1 or np.all(values == values.reshape(-1)[0])):
        return None
    return found


def write_tower(bank: Bank, model_key: str, base: OnnxTower, edited: OnnxTower, path: Path,
                provenance: dict) -> str:
    """The edited tower's graph at `path`, with provenance in its metadata, written once; returns
    how: "reused" (nothing changed), "patched" (initializers replaced) or "exported" (fresh)."""
    from .export import export_onnx, load_stripped, set_metadata

    import onnx

    external = tower_bytes(edited.module) > EXTERNAL_DATA_BYTES
    try:
        model = onnx.load(str(cached_base(bank, export_key(model_key, base), base)))
        patched = patch_initializers(model, changed_tensors(base.module, edited.module))
    except PermissionError:  # a bank shared read-only: no cache, every build exports afresh
        patched = None
    how = "patched" if patched else "reused"
    if patched is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as folder:
            fresh = Path(folder) / path.name
            export_onnx(edited, fresh)
            model, how = load_stripped(fresh), "exported"
    set_metadata(model, provenance)
    save_onnx(model, path, external)
    return how


def copy_onnx(source: Path, folder: Path, name: str) -> Path:
    """`source` (and its external data, under the name the graph records) copied into `folder`
    as `name`; for Triton's `<model>/1/model.onnx` layout."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in onnx_files(source):
        shutil.copyfile(file, folder / (name if file == source else file.name))
    return folder / name
