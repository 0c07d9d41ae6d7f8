"""Reading probe files as a model's preprocessing expects them: images as RGB PIL images,
audio as mono float32 waveforms at the model's rate. No torch: the build and an ONNX-only
client read files the same way."""

from __future__ import annotations

from math import gcd
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ptc.errors import InputError

if TYPE_CHECKING:  # PIL loads with the first image
    from PIL import Image


def open_image(path: Path) -> Image.Image:
    """One image file as an RGB PIL image; an unreadable file or a decompression bomb (a header
    claiming more pixels than PIL's limit, which it only warns about below twice the limit) is
    one clear InputError."""
    import warnings

    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path) as image:
                return image.convert("RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise InputError(
            f"probe {path}: refused as a decompression bomb: {exc}".split(" could be")[0],
            f"images may have at most {Image.MAX_IMAGE_PIXELS:,} pixels; resize it",
        ) from None
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError) as exc:
        raise InputError(
            f"probe {path}: cannot read as an image: {exc}",
            "remove the file from the probe folder or replace it with a valid image",
        ) from None


def open_images(paths: list[Path]) -> list[Image.Image]:
    """Read image files as RGB PIL images; an unreadable file is one clear error."""
    return [open_image(path) for path in paths]


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
