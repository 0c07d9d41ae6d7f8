"""The audio world for the zoo's CLAP members: deterministic files, attributes that a plain
signal analysis recovers (so each task is learnable from the sound), the style shift, and task
files that register and load through the CLAP family."""

from __future__ import annotations

import random

import numpy as np
import pytest
import soundfile

from conftest import tree_digest
from ptc.lab.zoo.audio_world import (
    LENGTHS,
    PITCHES,
    SHIFTED_RATE,
    TASKS,
    TEMPOS,
    Clip,
    render,
    write_task,
    write_world,
)
from ptc.lab.zoo.world import WorldSize

SMALL = WorldSize(pretrain=6, probes=4, train=2, test=1)


def test_the_audio_world_is_a_function_of_its_seed(tmp_path):
    write_world(tmp_path / "a", SMALL, seed=3)
    write_world(tmp_path / "b", SMALL, seed=3)
    write_world(tmp_path / "c", SMALL, seed=4)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b")
    assert tree_digest(tmp_path / "a") != tree_digest(tmp_path / "c")
    captions = (tmp_path / "a" / "pretrain" / "captions.jsonl").read_text().splitlines()
    assert len(captions) == SMALL.pretrain


def _clip(**values):
    base = {
        "pitch": "middle",
        "waveform": "sine",
        "tempo": "medium",
        "length": "long",
        "noise": "white",
    }
    return Clip(**{**base, **values})


def _dominant(samples, rate):
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return np.fft.rfftfreq(len(samples), 1 / rate)[spectrum.argmax()]


@pytest.mark.parametrize("shifted", [False, True])
def test_pitch_is_the_dominant_frequency(shifted):
    found = []
    for pitch, nominal in PITCHES.items():
        samples, rate = render(_clip(pitch=pitch), random.Random(1), shifted)
        found.append(_dominant(samples, rate))
        assert found[-1] == pytest.approx(nominal, rel=0.2), pitch
    assert found == sorted(found)


def _onsets_and_share(samples):
    """Note onsets and the share of the clip a note sounds, from the smoothed amplitude."""
    loud = np.convolve(np.abs(samples), np.ones(80) / 80, "same") > 0.2
    return np.count_nonzero(loud[1:] & ~loud[:-1]) + int(loud[0]), loud.mean()


def test_tempo_is_the_pulse_rate_and_length_the_share_of_a_beat_a_note_sounds():
    rng = random.Random(2)
    for tempo, rate_hz in TEMPOS.items():
        for length, share in LENGTHS.items():
            onsets, sounding = _onsets_and_share(
                render(_clip(tempo=tempo, length=length, noise="brown"), rng, False)[0]
            )
            assert abs(onsets - rate_hz) <= 1.5, (tempo, length, onsets)
            assert sounding == pytest.approx(share, abs=0.1), (tempo, length, sounding)


def test_noise_colours_differ_in_spectral_slope():
    tilt = {}
    for noise in ("white", "pink", "brown"):
        samples, rate = render(
            _clip(noise=noise, waveform="sine", pitch="low"), random.Random(7), False
        )
        power = np.abs(np.fft.rfft(samples)) ** 2
        frequencies = np.fft.rfftfreq(len(samples), 1 / rate)
        tilt[noise] = (
            power[(frequencies > 3000) & (frequencies < 7000)].mean()
            / power[(frequencies > 20) & (frequencies < 100)].mean()
        )
    assert tilt["white"] > tilt["pink"] > tilt["brown"]


def test_downstream_splits_are_shifted_and_tasks_register_and_load(tmp_path):
    from ptc import targets
    from ptc.compiler.bank.store import Bank
    from ptc.compiler.tasks.grid import load_task
    from ptc.lab.tiny.hf_clap import build_tiny

    files = write_world(tmp_path / "world", SMALL, seed=0)
    assert set(files) == set(TASKS)
    probe = sorted((tmp_path / "world" / "tasks" / "pitch" / "probes").glob("*.wav"))[0]
    samples, rate = soundfile.read(probe)
    assert rate == SHIFTED_RATE
    spectrum = np.abs(np.fft.rfft(samples))
    assert spectrum[np.fft.rfftfreq(len(samples), 1 / rate) > 4100].max() < 1e-2 * spectrum.max()
    bank = Bank(tmp_path / "bank")
    encoder = targets.load(f"hf:{build_tiny(tmp_path / 'clap', embed_dim=16, depths=(1,), seed=0)}")
    for task, path in files.items():
        record, _ = bank.add_task(load_task(path))
        assert len(record.probes) == SMALL.probes and record.classes == TASKS[task][0]
    batch = encoder.load_inputs(list(bank.task("tempo").probes))
    assert encoder.embed_inputs(batch).shape == (SMALL.probes, 16)


def test_the_audio_world_refuses_the_image_worlds_styles_and_shifts(tmp_path):
    import dataclasses

    from ptc.errors import InputError

    with pytest.raises(InputError, match="the audio world has no pretraining style 'spread'"):
        write_world(tmp_path, dataclasses.replace(SMALL, pretrain_style="spread"))
    with pytest.raises(InputError, match="the audio world has no downstream shift 'per-task'"):
        write_task(tmp_path, "pitch", dataclasses.replace(SMALL, downstream_shift="per-task"))
    with pytest.raises(
        InputError, match=r"the audio world draws no extra fine-tuning clips \(train_extra 5\)"
    ):
        write_task(tmp_path, "pitch", dataclasses.replace(SMALL, train_extra=5))
    assert not tmp_path.joinpath("pretrain").exists() and not tmp_path.joinpath("tasks").exists()
