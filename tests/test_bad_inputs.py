"""The bad-input corpus (tests/bad_inputs/cases.yaml) through the real CLI, in-process: one
line on stderr with the expected fragment, the expected exit code, and nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path
from string import Template
from unittest import mock

import pytest
import torch
import yaml
from click.testing import CliRunner

from ptc.compiler.bank.store import Bank
from ptc.compiler.cli.main import main

CASES = yaml.safe_load((Path(__file__).parent / "bad_inputs" / "cases.yaml").read_text())


def _png(path: Path, value: int) -> None:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (value, 40, 90)).save(path)


def _copy_descriptor(ctx, new_id: str, **changes) -> None:
    bank = Bank(ctx["copy"])
    source = bank.descriptor("colour", "src")
    tensors = {**source.tensors, "utd": changes.pop("utd", source.tensors["utd"])}
    # Sealed as a ptc without the write-side finite gate sealed it: the read side must refuse it.
    with mock.patch("ptc.compiler.bank.store.require_finite", lambda *args, **kwargs: None):
        bank.put_descriptor("colour", new_id, tensors, {**source.meta, "id": new_id, **changes})


def _operator_wrong_shape(ctx) -> None:
    from collections import Counter

    from ptc import targets
    from ptc.compiler.edit.operators import ensure_factors
    from ptc.compiler.embed import embed_grid, model_key

    bank, target = Bank(ctx["copy"]), targets.load(f"hf:{ctx['target']}")
    task, key = bank.task("colour"), model_key(target)
    ensure_factors(
        bank, key, target, task, embed_grid(target, task, bank, progress=False), Counter()
    )
    descriptor = bank.descriptor("colour", "src")
    bank.write_entry(
        bank.operator_rel(key, task.grid_hash, descriptor.sha256, 1.0),
        {"operator": torch.zeros(3, 3)},
        {"kind": "operator"},
    )


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-5] ^= 0x5A
    path.write_bytes(bytes(data))


SETUPS = {
    "copy": lambda ctx: shutil.copytree(ctx["bank"], ctx["copy"]),
    "tamper": lambda ctx: _flip_byte(
        Path(ctx["copy"]) / "descriptors" / "colour" / "src.safetensors"
    ),
    "truncate": lambda ctx: (
        Path(ctx["copy"]) / "descriptors" / "colour" / "src.safetensors"
    ).write_bytes(b"\x10\x00"),
    "task-record-corrupt": lambda ctx: (Path(ctx["copy"]) / "tasks" / "colour.json").write_text(
        "{not json"
    ),
    "descriptor-other-grid": lambda ctx: _copy_descriptor(ctx, "stale", grid_hash="0" * 64),
    "descriptor-wrong-shape": lambda ctx: _copy_descriptor(
        ctx, "short", utd=Bank(ctx["copy"]).descriptor("colour", "src").tensors["utd"][:-1]
    ),
    "descriptor-text-changed": lambda ctx: _copy_descriptor(
        ctx, "textft", finetuned_text_fingerprint="f" * 64
    ),
    "descriptor-nan": lambda ctx: _copy_descriptor(
        ctx, "nan", utd=torch.full((16, 4), float("nan"))
    ),
    "operator-wrong-shape": _operator_wrong_shape,
    "pickle-model": lambda ctx: _pickle_model(Path(ctx["tmp"]) / "pickled", ctx),
    "no-config-model": lambda ctx: _weights_only(Path(ctx["tmp"]) / "noconfig", config=None),
    "bert-model": lambda ctx: _weights_only(
        Path(ctx["tmp"]) / "bert", config='{"model_type": "bert"}'
    ),
    "probes": lambda ctx: (
        [_png(Path(ctx["tmp"]) / "probes" / f"{i}.png", 30 * i) for i in range(3)],
        (Path(ctx["tmp"]) / "empty").mkdir(),
    ),
    "bad-image": lambda ctx: (Path(ctx["tmp"]) / "probes" / "broken.png").write_bytes(
        b"not a png at all"
    ),
    "registered": lambda ctx: _register(ctx),
    "change-probe": lambda ctx: _png(Path(ctx["tmp"]) / "probes" / "0.png", 255),
    "symlink-out": lambda ctx: (Path(ctx["tmp"]) / "link").symlink_to(
        ctx["outside"], target_is_directory=True
    ),
    "nonempty-out": lambda ctx: (
        (Path(ctx["tmp"]) / "out").mkdir() or (Path(ctx["tmp"]) / "out" / "keep").write_text("x")
    ),
    "out-file": lambda ctx: (Path(ctx["tmp"]) / "out").write_text("a file"),
    "eval-data": lambda ctx: (
        _png(Path(ctx["tmp"]) / "data" / "red" / "a.png", 1),
        _png(Path(ctx["tmp"]) / "data" / "purple" / "b.png", 2),
    ),
    "bomb-image": lambda ctx: _png_header(Path(ctx["tmp"]) / "probes" / "bomb.png", 10_000, 10_000),
    "truncated-weights": lambda ctx: _truncated_weights(Path(ctx["tmp"]) / "truncated", ctx),
    "bank-is-file": lambda ctx: (Path(ctx["tmp"]) / "bankfile").write_text("not a bank"),
    "entry-is-folder": lambda ctx: _entry_as_folder(
        Path(ctx["copy"]) / "descriptors" / "colour" / "src.safetensors"
    ),
    "pickled-adapter": lambda ctx: _pickled_adapter(Path(ctx["tmp"]) / "pickled-adapter", ctx),
    "big-recipe": lambda ctx: (Path(ctx["tmp"]) / "big.yaml").write_text("# padding\n" * 600_000),
    "corrupt-report": lambda ctx: (
        (Path(ctx["tmp"]) / "broken-build").mkdir(),
        (Path(ctx["tmp"]) / "broken-build" / "report.json").write_text("{not json"),
    ),
    "corrupt-lock": lambda ctx: (
        (Path(ctx["tmp"]) / "broken-build").mkdir(),
        (Path(ctx["tmp"]) / "broken-build" / "terms.safetensors").write_bytes(b"x" * 64),
        (Path(ctx["tmp"]) / "broken-build" / "ptc.lock").write_text("[1, 2"),
    ),
    "not-a-bank": lambda ctx: (
        (Path(ctx["tmp"]) / "notbank").mkdir(),
        (Path(ctx["tmp"]) / "notbank" / ".notes.txt.999999999.x.tmp").write_text("mine"),
    ),
    "missing-target-plan": lambda ctx: (Path(ctx["tmp"]) / "plan.yaml").write_text(
        f"tasks: [{ctx['tmp']}/task.yaml]\nsources: [{{id: a, pre: 'hf:{ctx['source']}', "
        f"finetuned: {{t: '{ctx['adapter']}'}}}}]\ntargets: ['hf:{ctx['tmp']}/nowhere']\n"
    ),
    "task-file": lambda ctx: (Path(ctx["tmp"]) / "task.yaml").write_text(
        "name: t\nprobes: probes\nclasses: [cat, dog]\n"
    ),
    "onnx-only-build": lambda ctx: (
        (Path(ctx["tmp"]) / "fake-build").mkdir(),
        (Path(ctx["tmp"]) / "fake-build" / "report.json").write_text('{"native_ref": null}'),
    ),
}


def _damaged(
    source, folder: Path, config: str, weights: str, edit_config=None, edit_weights=None
) -> None:
    """A copy of the model or adapter folder `source` with its JSON config and/or its
    safetensors weights changed in place (a user's damaged checkpoint)."""
    import json

    from safetensors.torch import load_file, save_file

    shutil.copytree(source, folder)
    if edit_config is not None:
        document = json.loads((folder / config).read_text())
        edit_config(document)
        (folder / config).write_text(json.dumps(document))
    if edit_weights is not None:
        tensors = load_file(folder / weights)
        edit_weights(tensors)
        save_file(tensors, folder / weights, metadata={"format": "pt"})


def _hf(ctx, name: str, source: str = "target", **edits) -> None:
    _damaged(ctx[source], Path(ctx["tmp"]) / name, "config.json", "model.safetensors", **edits)


def _open_clip(ctx, name: str, **edits) -> None:
    from ptc.lab.tiny.openclip import build_tiny

    pristine = Path(ctx["tmp"]) / "open-clip-pristine"
    if not pristine.exists():
        build_tiny(pristine)
    _damaged(
        pristine,
        Path(ctx["tmp"]) / name,
        "open_clip_config.json",
        "open_clip_model.safetensors",
        **edits,
    )


def _adapter(ctx, name: str, **edits) -> None:
    _damaged(
        ctx["adapter"],
        Path(ctx["tmp"]) / name,
        "adapter_config.json",
        "adapter_model.safetensors",
        **edits,
    )


def _first(tensors: dict, fragment: str) -> str:
    return next(name for name in sorted(tensors) if fragment in name)


def _poison(tensors: dict, fragment: str, value: float = float("nan")) -> None:
    tensors[_first(tensors, fragment)].view(-1)[0] = value


DAMAGED = {
    # non-finite numbers
    "hf-nan-finetune": lambda ctx: _hf(
        ctx,
        "ft",
        "full",
        edit_weights=lambda t: _poison(t, "vision_model.encoder.layers.0.mlp.fc1.weight"),
    ),
    "hf-overflowing-finetune": lambda ctx: (
        _hf(  # finite weights whose forward pass overflows float32
            ctx,
            "ft",
            "full",
            edit_weights=lambda t: t["visual_projection.weight"].copy_(
                t["visual_projection.weight"].sign() * 3e38
            ),
        )
    ),
    "open-clip-inf": lambda ctx: _open_clip(
        ctx, "oc", edit_weights=lambda t: _poison(t, "visual.proj", float("inf"))
    ),
    "adapter-nan": lambda ctx: _adapter(ctx, "lora", edit_weights=lambda t: _poison(t, "lora_B")),
    # a config that disagrees with its weights
    "hf-fewer-layers": lambda ctx: _hf(
        ctx, "t", edit_config=lambda c: c["vision_config"].update(num_hidden_layers=1)
    ),
    "hf-more-layers": lambda ctx: _hf(
        ctx, "t", edit_config=lambda c: c["vision_config"].update(num_hidden_layers=3)
    ),
    "hf-huge-config": lambda ctx: _hf(
        ctx,
        "t",
        edit_config=lambda c: c["vision_config"].update(
            hidden_size=4096, intermediate_size=16384, num_hidden_layers=48
        ),
    ),
    "hf-resized-weight": lambda ctx: _hf(
        ctx, "t", edit_config=lambda c: c["vision_config"].update(intermediate_size=64)
    ),
    "open-clip-wider": lambda ctx: _open_clip(
        ctx, "oc", edit_config=lambda c: c["model_cfg"]["vision_cfg"].update(width=64)
    ),
    "adapter-rank": lambda ctx: _adapter(ctx, "lora", edit_config=lambda c: c.update(r=2 * c["r"])),
    # a library that fails on what the folder says
    "hf-unknown-activation": lambda ctx: _hf(
        ctx, "t", edit_config=lambda c: c["vision_config"].update(hidden_act="no_such_activation")
    ),
    "open-clip-unknown-timm-tower": lambda ctx: _open_clip(
        ctx,
        "oc",
        edit_config=lambda c: c["model_cfg"]["vision_cfg"].update(timm_model_name="no_such_tower"),
    ),
    "adapter-unknown-tuner": lambda ctx: _adapter(
        ctx, "lora", edit_config=lambda c: c.update(peft_type="NO_SUCH")
    ),
}
SETUPS.update(DAMAGED)


def _png_header(path: Path, width: int, height: int) -> None:
    """A PNG whose header claims width x height pixels (a decompression bomb's claim)."""
    import struct
    import zlib

    path.parent.mkdir(parents=True, exist_ok=True)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)

    def chunk(kind, data):
        return (
            struct.pack(">I", len(data))
            + kind
            + data
            + struct.pack(  # noqa: E731
                ">I", zlib.crc32(kind + data) & 0xFFFFFFFF
            )
        )

    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))


def _truncated_weights(folder: Path, ctx) -> None:
    """A model folder whose safetensors header claims more bytes than the file holds."""
    shutil.copytree(ctx["target"], folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4096])


def _entry_as_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _pickled_adapter(folder: Path, ctx) -> None:
    from safetensors.torch import load_file

    shutil.copytree(ctx["adapter"], folder)
    torch.save(load_file(folder / "adapter_model.safetensors"), folder / "adapter_model.bin")
    (folder / "adapter_model.safetensors").unlink()


def _pickle_model(folder: Path, ctx) -> None:
    folder.mkdir()
    shutil.copy(Path(ctx["target"]) / "config.json", folder / "config.json")
    torch.save({"weight": torch.zeros(2)}, folder / "pytorch_model.bin")


def _weights_only(folder: Path, config: str | None) -> None:
    from safetensors.torch import save_file

    folder.mkdir()
    save_file({"weight": torch.zeros(2)}, folder / "model.safetensors")
    if config:
        (folder / "config.json").write_text(config)


def _register(ctx) -> None:
    from ptc.compiler.tasks.grid import load_task

    task_file = Path(ctx["tmp"]) / "task.yaml"
    task_file.write_text("name: t\nprobes: probes\nclasses: [cat, dog]\n")
    # decode=False: registered as an older ptc did, which let an undecodable probe in
    Bank(Path(ctx["tmp"]) / "bank").add_task(load_task(task_file, decode=False))


def _snapshot(*roots: Path) -> dict:
    """Every file under the roots with size and mtime; lock files are coordination, not output."""
    return {
        str(p): (p.stat().st_size, p.stat().st_mtime_ns)
        for root in roots
        if root.exists()
        for p in root.rglob("*")
        if p.is_file() and ".locks" not in p.parts
    }


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_bad_input(case, world, tmp_path, tmp_path_factory):
    ctx = {
        "target": str(world.target),
        "source": str(world.source),
        "adapter": str(world.adapters["colour"]),
        "bank": str(world.bank),
        "copy": str(tmp_path / "copy"),
        "tmp": str(tmp_path),
        "outside": str(tmp_path_factory.mktemp("outside")),
        "full": str(world.full_finetune),
        "colour_test": str(world.tasks["colour"].parent / "test"),
    }
    fill = lambda text: Template(text).substitute(ctx)  # noqa: E731
    for name in case.get("setup", []):
        SETUPS[name](ctx)
    if "recipe" in case:
        (tmp_path / "recipe.yaml").write_text(fill(case["recipe"]))
        command = case.get("command", ["check", "$tmp/recipe.yaml"])
    elif "task" in case:
        (tmp_path / "task.yaml").write_text(fill(case["task"]))
        command = case.get("command", ["task", "add", "$tmp/task.yaml", "--bank", "$tmp/bank"])
    else:
        command = case["command"]
    before = _snapshot(tmp_path, world.bank)
    result = CliRunner().invoke(main, [fill(str(arg)) for arg in command])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == case.get("code", 2), (result.exit_code, result.stderr, result.stdout)
    assert len(lines) == 1 and lines[0].startswith("ptc: error: "), result.stderr
    assert fill(case["expect"]) in lines[0], lines[0]
    assert _snapshot(tmp_path, world.bank) == before, "a failed command wrote files"


def test_corpus_size_and_unique_ids():
    ids = [c["id"] for c in CASES]
    assert len(ids) >= 60 and len(set(ids)) == len(ids)
    assert all(s in SETUPS for c in CASES for s in c.get("setup", []))
