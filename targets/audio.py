"""Reading audio probes: any file libsndfile reads (wav, flac, ogg, mp3), mixed to mono,
resampled to the model's rate and cut to its window."""

from __future__ import annotations

from math import gcd
from pathlib import Path

import numpy as np

from ptc.errors import InputError


def read_audio(path: Path, rate: int, max_samples: int) -> np.ndarray:
    """One mono float32 waveform at `rate` Hz, at most `max_samples` long.

    Cutting to the model's window here, rather than leaving it to the feature extractor,
    keeps embeddings deterministic: CLAP's extractor picks a random crop of a longer clip."""
    import soundfile
    from scipy.signal import resample_poly

    try:
        samples, file_rate = soundfile.read(str(path), dtype="float32", always_2d=True)
    except RuntimeError as exc:  # soundfile.LibsndfileError and its kin
        raise InputError(
            f"probe {path}: cannot read as audio: {exc}",
            "remove the file from the probe folder or replace it with a valid wav/flac file",
        ) from None
    if len(samples) == 0:
        raise InputError(
            f"probe {path}: the audio file holds no samples", "remove it from the probe folder"
        )
    mono = samples.mean(axis=1)
    # Cut before resampling (a long recording costs nothing beyond the window), with a margin
    # so the polyphase filter sees the same neighbourhood at the cut.
    mono = mono[: int(np.ceil(max_samples * file_rate / rate)) + 64]
    if file_rate != rate:
        step = gcd(int(file_rate), int(rate))
        mono = resample_poly(mono, rate // step, int(file_rate) // step).astype(np.float32)
    return mono[:max_samples]
