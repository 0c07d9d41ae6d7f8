"""Audio probes: read by libsndfile, mixed to mono, resampled and cut to the model's window."""

import numpy as np
import pytest
import soundfile

from ptc.errors import InputError
from ptc.media import read_audio


def _tone(rate, seconds, freq=440.0):
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def test_resampled_tone_matches_the_tone_synthesised_at_the_target_rate(tmp_path):
    soundfile.write(str(tmp_path / "a.flac"), _tone(22050, 0.5), 22050)
    got = read_audio(tmp_path / "a.flac", 16000, 16000)
    expected = _tone(16000, 0.5)
    assert abs(len(got) - len(expected)) <= 1
    n = min(len(got), len(expected))
    # Away from the edges the polyphase filter is transparent at 440 Hz (flac is 16-bit: ~3e-5).
    assert np.abs(got[200 : n - 200] - expected[200 : n - 200]).max() < 2e-3


def test_stereo_is_mixed_and_long_clips_are_cut_to_the_window(tmp_path):
    left, right = _tone(16000, 2.0, 300.0), _tone(16000, 2.0, 700.0)
    soundfile.write(
        str(tmp_path / "s.wav"), np.stack([left, right], axis=1), 16000, subtype="FLOAT"
    )
    got = read_audio(tmp_path / "s.wav", 16000, 8000)
    assert got.shape == (8000,) and got.dtype == np.float32
    assert np.abs(got - (left[:8000] + right[:8000]) / 2).max() < 1e-6


@pytest.mark.parametrize(
    "content,fragment", [(b"not audio at all", "cannot read as audio"), (None, "holds no samples")]
)
def test_unreadable_audio_is_one_clear_error(tmp_path, content, fragment):
    path = tmp_path / "bad.wav"
    if content is None:
        soundfile.write(str(path), np.zeros(0, dtype=np.float32), 16000)
    else:
        path.write_bytes(content)
    with pytest.raises(InputError, match=fragment) as info:
        read_audio(path, 16000, 16000)
    assert str(path) in str(info.value)
