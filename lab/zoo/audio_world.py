"""The zoo's generated audio world, for CLAP members: clips of attributes, their captions,
and the task files (the counterpart of world.py, for the `audio` zoo profile).

A clip is a pulsed tone: a waveform at a pitch, pulsing at a tempo in short or long notes,
over a background noise of some colour. Each attribute is a task. Pretraining clips are
clean at 16 kHz; downstream task splits (probes, train, test) are *shifted*: stored at
22.05 kHz, band-limited and noisier, as a field recording is for a CLAP trained on studio
sound. Everything is a pure function of the seed, one random stream per part.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ptc.errors import InputError
from ptc.lab.zoo.world import WorldSize

SECONDS = 1.0
PLAIN_RATE, SHIFTED_RATE = 16000, 22050
PITCHES = {"low": 196.0, "middle": 392.0, "high": 784.0, "very high": 1568.0}  # an octave apart
WAVEFORMS = ("sine", "square", "sawtooth", "triangle")
TEMPOS = {"slow": 2.0, "medium": 4.0, "fast": 8.0}  # pulses per second
# The share of each beat a note sounds. (A pitch glide rising, falling or steady over the clip
# was a task before: HTSAT towers on 16 mel bins did not learn its direction, 0.61 after 300
# supervised steps where tempo reached 0.97, and its class prompts collapsed on every member.)
LENGTHS = {"short": 0.2, "long": 0.7}
NOISES = ("white", "pink", "brown")

TASKS = {
    "pitch": (tuple(PITCHES), ("the sound of a {} pitched tone.", "a {} note.")),
    "waveform": (WAVEFORMS, ("the sound of a {} wave.", "a {} tone.")),
    "tempo": (tuple(TEMPOS), ("a {} pulse.", "beeps at a {} tempo.")),
    "length": (tuple(LENGTHS), ("{} beeps.", "a tone in {} notes.")),
    "noise": (NOISES, ("over {} noise.", "a tone with {} noise behind it.")),
}
CONTROL_TASKS = ("noise",)
IN_DISTRIBUTION: dict[str, str] = {}  # no plain-style variants (yet)
INPUT_KEY = "clip"  # what captions.jsonl calls a pretraining input


@dataclass(frozen=True)
class Clip:
    pitch: str
    waveform: str
    tempo: str
    length: str
    noise: str

    def value(self, task: str) -> str:
        return getattr(self, task)


def sample_clip(rng: random.Random, fixed: dict | None = None) -> Clip:
    values = {"pitch": rng.choice(tuple(PITCHES)), "waveform": rng.choice(WAVEFORMS),
              "tempo": rng.choice(tuple(TEMPOS)), "length": rng.choice(tuple(LENGTHS)), "noise": rng.choice(NOISES)}
    values.update(fixed or {})
    return Clip(**values)


def _noise(colour: str, n: int, generator: np.random.Generator) -> np.ndarray:
    """Unit-variance noise with a 1/f^k power spectrum: white k=0, pink k=1, brown k=2."""
    k = {"white": 0.0, "pink": 1.0, "brown": 2.0}[colour]
    spectrum = generator.normal(size=n // 2 + 1) + 1j * generator.normal(size=n // 2 + 1)
    frequencies = np.fft.rfftfreq(n)
    frequencies[0] = frequencies[1]
    samples = np.fft.irfft(spectrum / frequencies ** (k / 2), n)
    return samples / samples.std()


def _lowpass(samples: np.ndarray, rate: int, cutoff: float) -> np.ndarray:
    spectrum = np.fft.rfft(samples)
    spectrum[np.fft.rfftfreq(len(samples), 1 / rate) > cutoff] = 0
    return np.fft.irfft(spectrum, len(samples))


def render(clip: Clip, rng: random.Random, shifted: bool) -> tuple[np.ndarray, int]:
    """(float32 samples in [-1, 1], sample rate) of one clip in the plain or the shifted style."""
    rate = SHIFTED_RATE if shifted else PLAIN_RATE
    t = np.arange(int(rate * SECONDS)) / rate
    base = PITCHES[clip.pitch] * 2 ** rng.uniform(-0.15, 0.15)
    phase = (base * t + rng.random()) % 1.0
    wave = {"sine": np.sin(2 * np.pi * phase), "square": np.where(phase < 0.5, 1.0, -1.0),
            "sawtooth": 2 * phase - 1, "triangle": 1 - 4 * np.abs(phase - 0.5)}[clip.waveform]
    pulses = TEMPOS[clip.tempo] * 2 ** rng.uniform(-0.1, 0.1)
    envelope = ((t * pulses + rng.random()) % 1.0 < LENGTHS[clip.length]).astype(float)
    generator = np.random.default_rng(rng.randrange(2 ** 32))
    noise_level = rng.uniform(0.25, 0.4) if shifted else rng.uniform(0.05, 0.12)
    samples = rng.uniform(0.4, 0.7) * wave * envelope + noise_level * _noise(clip.noise, len(t), generator) * 0.3
    if shifted:  # a telephone-like band and more noise: a style pretraining never heard
        samples = _lowpass(samples, rate, 4000.0)
    return np.clip(samples, -1, 1).astype(np.float32), rate


def caption(clip: Clip, rng: random.Random, template_share: float = 0.3) -> str:
    """A caption naming a random subset of the attributes; sometimes in a task's own template."""
    if rng.random() < template_share:
        task = rng.choice(tuple(TASKS))
        return rng.choice(TASKS[task][1]).replace("{}", clip.value(task))
    phrases = {"pitch": f"a {clip.pitch} pitched", "waveform": f"{clip.waveform} wave",
               "tempo": f"pulsing at a {clip.tempo} tempo", "length": f"in {clip.length} notes",
               "noise": f"over {clip.noise} noise"}
    picked = [p for p in phrases.values() if rng.random() < 0.7] or [rng.choice(list(phrases.values()))]
    rng.shuffle(picked)
    return "the sound of " + ", ".join(picked) + "."


def _save(clip: Clip, path: Path, shifted: bool, rng: random.Random) -> None:
    import soundfile

    path.parent.mkdir(parents=True, exist_ok=True)
    samples, rate = render(clip, rng, shifted)
    soundfile.write(str(path), samples, rate, subtype="PCM_16")


def write_world(root: Path, size: WorldSize = WorldSize(), seed: int = 0,
                template_share: float = 0.3) -> dict[str, Path]:
    """root/pretrain/{clips/*.wav, captions.jsonl}; root/tasks/<task>/{task.yaml, probes/,
    train/<class>/, test/<class>/}. Returns task name -> task file. With `size.pretrain == 0`
    only the task splits are written, byte for byte those of any larger world."""
    check_size(size)
    rng = random.Random(f"audio/{seed}/pretrain")
    lines = []
    for i in range(size.pretrain):
        clip = sample_clip(rng)
        _save(clip, root / "pretrain" / "clips" / f"{i:06d}.wav", False, rng)
        lines.append(json.dumps({INPUT_KEY: f"clips/{i:06d}.wav", "caption": caption(clip, rng, template_share)}))
    if size.pretrain:
        (root / "pretrain" / "captions.jsonl").write_text("\n".join(lines) + "\n")
    return {task: write_task(root, task, size, seed) for task in TASKS}


def check_size(size: WorldSize) -> None:
    """The image world's styles have no meaning for clips (their one shift is the sample rate),
    and extra fine-tuning or test clips are not drawn here."""
    if size.pretrain_style != "plain":
        raise InputError(f"the audio world has no pretraining style {size.pretrain_style!r}", "use 'plain'")
    if size.downstream_shift != "shared":
        raise InputError(f"the audio world has no downstream shift {size.downstream_shift!r}", "use 'shared'")
    if size.train_extra:
        raise InputError(f"the audio world draws no extra fine-tuning clips (train_extra {size.train_extra})",
                         "use 0, or more train clips per class")
    if size.test_extra:
        raise InputError(f"the audio world draws no extra test clips (test_extra {size.test_extra})",
                         "use 0, or more test clips per class (its splits are all regenerated)")


def write_task(root: Path, task: str, size: WorldSize = WorldSize(), seed: int = 0) -> Path:
    """One task's folder (probes, train and test splits, task.yaml) from its own random stream."""
    check_size(size)
    classes, templates = TASKS[task]
    folder, rng = root / "tasks" / task, random.Random(f"audio/{seed}/{task}")
    for i in range(size.probes):
        _save(sample_clip(rng), folder / "probes" / f"{i:04d}.wav", True, rng)
    for split, count in (("train", size.train), ("test", size.test)):
        for label in classes:
            for i in range(count):
                _save(sample_clip(rng, {task: label}), folder / split / label / f"{i:04d}.wav", True, rng)
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump({"name": task, "probes": "probes", "classes": list(classes),
                                    "templates": list(templates)}, sort_keys=False))
    return path
