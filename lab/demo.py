"""The built-in offline default: a tiny generated world, two tiny CLIP models of different
widths, a LoRA source fine-tuned here, and a recipe built end to end.

Nothing is downloaded. The models start from random weights, so the accuracies it prints
show the pipeline working, not the method's gains (the offline zoo is for that).
"""

from __future__ import annotations

import random
from pathlib import Path

import yaml

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 70, 230),
    "yellow": (235, 215, 40),
}
SHAPES = ("circle", "square", "triangle")
TEMPLATES = ("a photo of a {} shape.", "a {} thing.")


def draw(colour: str, shape: str, rng: random.Random, size: int = 32):
    from PIL import Image, ImageDraw

    grey = rng.randint(60, 160)
    image = Image.new("RGB", (size, size), (grey, grey, grey))
    pen = ImageDraw.Draw(image)
    extent = rng.randint(size // 3, size // 2)
    x, y = rng.randint(0, size - extent), rng.randint(0, size - extent)
    box = (x, y, x + extent, y + extent)
    fill = tuple(min(255, max(0, c + rng.randint(-20, 20))) for c in COLOURS[colour])
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    else:
        pen.polygon([(x, y + extent), (x + extent, y + extent), (x + extent // 2, y)], fill=fill)
    return image


def write_world(
    root: Path, probes: int = 24, train: int = 16, test: int = 12, seed: int = 0
) -> dict[str, Path]:
    """Two tasks over the same images (colour, shape): unlabeled probes, a labelled train split
    per class, and a held-out labelled test split. Returns task name -> task file."""
    rng = random.Random(seed)
    tasks = {"colour": tuple(COLOURS), "shape": SHAPES}
    files = {}
    for task, classes in tasks.items():
        folder = root / task
        for i in range(probes):
            path = folder / "probes" / f"{i:04d}.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            draw(rng.choice(tuple(COLOURS)), rng.choice(SHAPES), rng).save(path)
        for split, count in (("train", train), ("test", test)):
            for label in classes:
                for i in range(count):
                    colour = label if task == "colour" else rng.choice(tuple(COLOURS))
                    shape = label if task == "shape" else rng.choice(SHAPES)
                    path = folder / split / label / f"{i:04d}.png"
                    path.parent.mkdir(parents=True, exist_ok=True)
                    draw(colour, shape, rng).save(path)
        files[task] = folder / "task.yaml"
        files[task].write_text(
            yaml.safe_dump(
                {
                    "name": task,
                    "probes": "probes",
                    "classes": list(classes),
                    "templates": list(TEMPLATES),
                },
                sort_keys=False,
            )
        )
    return files


WAVEFORMS = ("sine", "square", "sawtooth")
PITCHES = {"low": 220.0, "high": 1320.0}
AUDIO_TEMPLATES = ("the sound of a {} tone.", "a {} sound.")


def synthesise(waveform: str, pitch: str, rng: random.Random, rate: int, seconds: float):
    """A tone of one waveform near one pitch, with a random detune, level and a little noise."""
    import numpy as np

    t = np.arange(int(rate * seconds)) / rate
    phase = (PITCHES[pitch] * 2 ** rng.uniform(-0.25, 0.25) * t + rng.random()) % 1.0
    wave = {
        "sine": np.sin(2 * np.pi * phase),
        "square": np.where(phase < 0.5, 1.0, -1.0),
        "sawtooth": 2 * phase - 1,
    }[waveform]
    noise = np.random.default_rng(rng.randrange(2**32)).normal(0, 0.02, len(t))
    return (rng.uniform(0.2, 0.6) * wave + noise).astype("float32")


def write_audio_world(
    root: Path, probes: int = 12, train: int = 8, test: int = 6, seed: int = 0
) -> dict[str, Path]:
    """The audio counterpart of `write_world`: tasks waveform and pitch over generated tones.
    Files vary in container (wav, flac), sample rate (16 and 22.05 kHz), channels and length
    (some longer than a 1 s window), as real probe folders do."""
    import soundfile

    rng = random.Random(seed)
    tasks = {"waveform": WAVEFORMS, "pitch": tuple(PITCHES)}

    def write(path: Path, waveform: str, pitch: str) -> None:
        rate, suffix = rng.choice(((16000, ".wav"), (22050, ".flac")))
        samples = synthesise(waveform, pitch, rng, rate, rng.uniform(0.4, 1.5))
        if rng.random() < 0.3:
            samples = samples[:, None].repeat(2, axis=1)  # stereo
        path = path.with_suffix(suffix)
        path.parent.mkdir(parents=True, exist_ok=True)
        soundfile.write(str(path), samples, rate)

    files = {}
    for task, classes in tasks.items():
        folder = root / task
        for i in range(probes):
            write(folder / "probes" / f"{i:04d}", rng.choice(WAVEFORMS), rng.choice(tuple(PITCHES)))
        for split, count in (("train", train), ("test", test)):
            for label in classes:
                for i in range(count):
                    waveform = label if task == "waveform" else rng.choice(WAVEFORMS)
                    pitch = label if task == "pitch" else rng.choice(tuple(PITCHES))
                    write(folder / split / label / f"{i:04d}", waveform, pitch)
        files[task] = folder / "task.yaml"
        files[task].write_text(
            yaml.safe_dump(
                {
                    "name": task,
                    "probes": "probes",
                    "classes": list(classes),
                    "templates": list(AUDIO_TEMPLATES),
                },
                sort_keys=False,
            )
        )
    return files


def run_demo(workdir: Path, steps: int = 60, echo=print) -> dict:
    """Generate everything under `workdir`, then task add -> finetune -> descriptor add ->
    build -> eval, exactly as a user would run the commands."""
    from ptc import targets
    from ptc.compiler.bank.store import Bank
    from ptc.compiler.build.pipeline import execute
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan
    from ptc.compiler.sources.descriptor import add_descriptor
    from ptc.compiler.sources.finetune import finetune_lora
    from ptc.compiler.tasks.grid import load_task
    from ptc.compiler.verify.evaluate import evaluate
    from ptc.lab.tiny.hf_clip import build_tiny

    workdir = Path(workdir).resolve()
    bank = Bank(workdir / "bank")
    echo(f"world and task files -> {workdir / 'world'}")
    task_files = write_world(workdir / "world")
    echo("tiny CLIP models: source (width 48, d=32), target (width 64, d=24)")
    source_dir = build_tiny(workdir / "models" / "source", width=48, embed_dim=32, seed=1)
    target_dir = build_tiny(workdir / "models" / "target", width=64, embed_dim=24, seed=2)
    source = targets.load(f"hf:{source_dir}")
    for name, task_file in task_files.items():
        task, _ = bank.add_task(load_task(task_file))
        adapter = workdir / "sources" / f"source-{name}"
        stats = finetune_lora(
            source, task, task_file.parent / "train", adapter, steps=steps, replace=True
        )
        echo(
            f"source LoRA on {name}: {stats['steps']} steps, last batch accuracy {stats['final_batch_accuracy']:.2f}"
        )
        add_descriptor(bank, name, f"hf:{source_dir}", str(adapter), "source")
    recipe = workdir / "recipe.yaml"
    recipe.write_text(
        yaml.safe_dump(
            {
                "target": f"hf:{target_dir}",
                "terms": [
                    {"task": "colour", "source": "source", "weight": 0.5},
                    {"task": "shape", "source": "source", "weight": -0.5},
                ],
                "bank": "bank",
                "export": {"out": "dist/target-edit"},
            },
            sort_keys=False,
        )
    )
    echo(f"ptc build {recipe}")
    report = execute(plan(recipe, Options(force=True)), Options(force=True))
    out = workdir / "dist" / "target-edit"
    for name, task_file in task_files.items():
        before = evaluate(
            f"hf:{target_dir}", bank.task(name), task_file.parent / "test", progress=False
        )
        after = evaluate(str(out), bank.task(name), task_file.parent / "test", progress=False)
        echo(f"target zero-shot on {name}: {before['accuracy']:.3f} -> {after['accuracy']:.3f}")
    return report
