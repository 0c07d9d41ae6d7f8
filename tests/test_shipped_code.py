"""No code shipped with a model ever runs, on any loading path.

Every case plants, in a copy of a real tiny checkpoint, a Python module (and pickles) that write
a sentinel file when imported or unpickled, names it the way that path's library would import
it (transformers' auto_map, trust_remote_code, open_clip's tokenizer_kwargs and hf_model_name,
peft's pickled adapter, torch pickles), and runs the real CLI through that path. Each must exit
2 with one line, and the sentinel must not exist.
"""

from __future__ import annotations

import json
import pathlib
import pickle
import shutil
from pathlib import Path

import pytest

from conftest import run_ptc

CODE = "import pathlib\npathlib.Path({sentinel!r}).write_text('ran')\nclass Evil:\n    pass\n"


class _RunsWhenUnpickled:
    def __init__(self, sentinel: Path):
        self.sentinel = sentinel

    def __reduce__(self):
        return pathlib.Path.write_text, (pathlib.Path(self.sentinel), "ran")


def _plant(folder: Path, sentinel: Path) -> None:
    (folder / "evil_code.py").write_text(CODE.format(sentinel=str(sentinel)))


def _edit_json(path: Path, **changes) -> None:
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split(".")
        for parent in parents:
            target = target.setdefault(parent, {})
        target[last] = value
    path.write_text(json.dumps(data))


def _hf_copy(world, tmp: Path, sentinel: Path, which: str = "target") -> Path:
    folder = tmp / f"evil-{which}"
    shutil.copytree(getattr(world, which), folder)
    _plant(folder, sentinel)
    return folder


def _hf_auto_map(config: str, auto_class: str):
    def make(world, tmp, sentinel):
        folder = _hf_copy(world, tmp, sentinel)
        _edit_json(folder / config, auto_map={auto_class: "evil_code.Evil"})
        return f"hf:{folder}"

    return make


def _hf_trust_flag(world, tmp, sentinel):
    folder = _hf_copy(world, tmp, sentinel)
    _edit_json(folder / "tokenizer_config.json", trust_remote_code=True)
    return f"hf:{folder}"


def _hf_pickle_only(world, tmp, sentinel):
    folder = _hf_copy(world, tmp, sentinel)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps(_RunsWhenUnpickled(sentinel)))
    return f"hf:{folder}"


def _open_clip_folder(tmp: Path, sentinel: Path) -> Path:
    from ptc.lab.tiny.openclip import build_tiny

    folder = build_tiny(tmp / "evil-open-clip", vocab="tiny")
    _plant(folder, sentinel)
    return folder


def _open_clip_tokenizer_kwargs(world, tmp, sentinel):
    folder = _open_clip_folder(tmp, sentinel)
    _edit_json(
        folder / "open_clip_config.json",
        **{"model_cfg.text_cfg.tokenizer_kwargs": {"trust_remote_code": True}},
    )
    return f"open_clip:local-dir:{folder}"


def _open_clip_tokenizer_auto_map(world, tmp, sentinel):
    folder = _open_clip_folder(tmp, sentinel)
    _edit_json(
        folder / "tokenizer_config.json", auto_map={"AutoTokenizer": ["evil_code.Evil", None]}
    )
    return f"open_clip:local-dir:{folder}"


def _open_clip_hf_text_tower(world, tmp, sentinel):
    evil = _hf_copy(world, tmp, sentinel)
    _edit_json(evil / "config.json", auto_map={"AutoConfig": "evil_code.Evil"})
    folder = _open_clip_folder(tmp, sentinel)
    _edit_json(folder / "open_clip_config.json", **{"model_cfg.text_cfg.hf_model_name": str(evil)})
    return f"open_clip:local-dir:{folder}"


def _open_clip_pickle_weights(world, tmp, sentinel):
    weights = tmp / "weights.bin"
    weights.write_bytes(pickle.dumps(_RunsWhenUnpickled(sentinel)))
    return f"open_clip:ViT-B-32@{weights}"


def _adapter_copy(world, tmp, sentinel) -> Path:
    folder = tmp / "evil-adapter"
    shutil.copytree(world.adapters["colour"], folder)
    _plant(folder, sentinel)
    return folder


def _adapter_pickle_only(world, tmp, sentinel):
    folder = _adapter_copy(world, tmp, sentinel)
    (folder / "adapter_model.safetensors").unlink()
    (folder / "adapter_model.bin").write_bytes(pickle.dumps(_RunsWhenUnpickled(sentinel)))
    return str(folder)


def _adapter_auto_map(world, tmp, sentinel):
    folder = _adapter_copy(world, tmp, sentinel)
    _edit_json(folder / "adapter_config.json", auto_map={"AutoModel": "evil_code.Evil"})
    return str(folder)


def _adapter_imports_a_module(world, tmp, sentinel):
    folder = _adapter_copy(world, tmp, sentinel)
    _edit_json(folder / "adapter_config.json", megatron_config={"x": 1}, megatron_core="evil_code")
    return str(folder)


def _full_finetune_auto_map(world, tmp, sentinel):
    folder = _hf_copy(world, tmp, sentinel, which="full_finetune")
    _edit_json(
        folder / "preprocessor_config.json", auto_map={"AutoImageProcessor": "evil_code.Evil"}
    )
    return str(folder)  # a bare folder: read with the source's scheme


def _build_output_auto_map(world, tmp, sentinel):
    """`ptc eval OUT` reads a build output's native checkpoint."""
    out = tmp / "evil-output"
    shutil.copytree(world.target, out / "model")
    _plant(out / "model", sentinel)
    _edit_json(
        out / "model" / "preprocessor_config.json",
        auto_map={"AutoImageProcessor": "evil_code.Evil"},
    )
    (out / "report.json").write_text(json.dumps({"native_ref": "hf:model"}))
    return str(out)


# (how the model is made, which role it plays in the command, what the one line says)
CASES = {
    "hf-config-auto_map": (
        _hf_auto_map("config.json", "AutoModel"),
        "target",
        "names custom code (auto_map",
    ),
    "hf-processor-auto_map": (
        _hf_auto_map("preprocessor_config.json", "AutoImageProcessor"),
        "source",
        "preprocessor_config.json names custom code",
    ),
    "hf-tokenizer-auto_map": (
        _hf_auto_map("tokenizer_config.json", "AutoTokenizer"),
        "source",
        "tokenizer_config.json names custom code",
    ),
    "hf-trust_remote_code-config": (
        _hf_trust_flag,
        "target",
        "names custom code (trust_remote_code)",
    ),
    "hf-pickle-weights": (_hf_pickle_only, "source", "holds only pickle weights"),
    "open_clip-tokenizer_kwargs": (
        _open_clip_tokenizer_kwargs,
        "target",
        "tokenizer_kwargs.trust_remote_code",
    ),
    "open_clip-tokenizer-auto_map": (
        _open_clip_tokenizer_auto_map,
        "target",
        "names custom code (auto_map",
    ),
    "open_clip-hf-text-tower": (
        _open_clip_hf_text_tower,
        "target",
        "text_cfg.hf_model_name loads a tower",
    ),
    "open_clip-pickle-weights": (_open_clip_pickle_weights, "target", "weights.bin is a pickle"),
    "peft-adapter-pickle": (
        _adapter_pickle_only,
        "finetuned",
        "saved only as a pickle (adapter_model.bin)",
    ),
    "peft-adapter-auto_map": (
        _adapter_auto_map,
        "finetuned",
        "adapter_config.json names custom code",
    ),
    "peft-adapter-module-import": (
        _adapter_imports_a_module,
        "finetuned",
        "names a module to import",
    ),
    "full-finetune-auto_map": (_full_finetune_auto_map, "finetuned", "names custom code (auto_map"),
    "build-output-auto_map": (_build_output_auto_map, "eval", "names custom code (auto_map"),
}


def _command(role: str, ref: str, world, tmp: Path) -> list:
    bank = tmp / "bank"
    shutil.copytree(world.bank, bank)
    if role == "target":
        recipe = tmp / "recipe.yaml"
        recipe.write_text(
            f"target: {ref}\nbank: {bank}\nterms: [{{task: colour, source: src, weight: 0.5}}]\n"
        )
        return ["check", recipe]
    if role == "eval":
        return [
            "eval",
            ref,
            "--task",
            "colour",
            "--data",
            world.tasks["colour"].parent / "test",
            "--bank",
            bank,
        ]
    source, finetuned = (
        (ref, world.adapters["colour"]) if role == "source" else (f"hf:{world.source}", ref)
    )
    return [
        "descriptor",
        "add",
        "--task",
        "colour",
        "--source",
        source,
        "--finetuned",
        finetuned,
        "--id",
        "evil",
        "--bank",
        bank,
    ]


@pytest.mark.parametrize("case", list(CASES))
def test_no_code_shipped_with_a_model_runs(case, world, tmp_path):
    make, role, expected = CASES[case]
    sentinel = tmp_path / "code-ran"
    command = _command(role, make(world, tmp_path, sentinel), world, tmp_path)
    result = run_ptc(*command)
    lines = result.stderr.strip().splitlines()
    assert not sentinel.exists(), f"{case}: shipped code ran"
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("ptc: error: ") and expected in lines[0], lines


def test_every_transformers_loader_is_told_not_to_trust_the_folder(world, monkeypatch):
    """The second wall, behind the scan: every transformers from_pretrained ptc calls gets
    trust_remote_code=False, so no library decides on its own (or asks on stdin) whether to
    run a folder's code. (For a known model type transformers would not ask anyway, so a
    planted file cannot tell the difference; the calls themselves are what is checked.)"""
    import transformers

    from ptc import targets

    calls = []
    for name in ("AutoTokenizer", "AutoImageProcessor", "CLIPModel"):
        cls = getattr(transformers, name)
        original = cls.from_pretrained.__func__

        def spy(klass, *args, _original=original, _name=name, **kwargs):
            calls.append((_name, kwargs.get("trust_remote_code", "missing")))
            return _original(klass, *args, **kwargs)

        monkeypatch.setattr(cls, "from_pretrained", classmethod(spy))
    targets.load(f"hf:{world.target}")
    assert sorted(calls) == [
        ("AutoImageProcessor", False),
        ("AutoTokenizer", False),
        ("CLIPModel", False),
    ]
