"""The contract's preprocessing with numpy and PIL: files in, the input graph's arrays out.

Images are resized by PIL. The families' own processors resize with torchvision (transformers
5) or with torchvision on PIL images (open_clip): an image already at the model's size passes
through both unchanged, and a resized one can differ from the family's by one intensity level
in a few pixels, the rounding of two resize implementations. The build measures both on its
check inputs (report: serving_preprocess_max_levels).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ptc.media import open_image, read_audio

if TYPE_CHECKING:
    from PIL import Image

Arrays = dict[str, np.ndarray]


def input_arrays(paths: list[Path], spec: dict[str, Any]) -> Arrays:
    """The input graph's arrays for `paths`, by the contract's preprocessing record."""
    kind = spec["kind"]
    if kind == "audio":
        return {
            spec["input"]: np.stack(
                [
                    log_mel(read_audio(p, spec["sampling_rate"], spec["max_samples"]), spec)
                    for p in paths
                ]
            )[:, None]
        }
    images = [open_image(Path(p)) for p in paths]
    if kind == "naflex":
        return naflex_arrays(images, spec)
    return {spec["input"]: np.stack([image_array(image, spec) for image in images])}


# -- images -------------------------------------------------------------------------------------
def _resample(spec: dict[str, Any]) -> Any:
    from PIL import Image

    return {
        "nearest": Image.Resampling.NEAREST,
        "bilinear": Image.Resampling.BILINEAR,
        "bicubic": Image.Resampling.BICUBIC,
    }[spec["interpolation"]]


def shortest_edge_size(width: int, height: int, shortest: int) -> tuple[int, int]:
    """(width, height) with the shorter side at `shortest`, the longer truncated to an int."""
    if width <= height:
        return shortest, int(shortest * height / width)
    return int(shortest * width / height), shortest


def keep_ratio_size(width: int, height: int, rule: dict[str, Any]) -> tuple[int, int]:
    """(width, height) scaled by one factor so that the longer (`fit: longest`) or the shorter
    side fits the target, each side rounded half to even (open_clip's ResizeKeepRatio)."""
    ratios = (height / rule["height"], width / rule["width"])
    ratio = max(ratios) if rule["fit"] == "longest" else min(ratios)
    return round(width / ratio), round(height / ratio)


def _centre_offset(extra: int, rule: str) -> int:
    return extra // 2 if rule == "floor" else int(round(extra / 2))  # round: half to even


def center_crop(pixels: np.ndarray, crop: dict[str, Any]) -> np.ndarray:
    """Crop (zero-padding first where the image is smaller) an H x W x C array to the centre."""
    height, width = crop["height"], crop["width"]
    pad_h, pad_w = max(height - pixels.shape[0], 0), max(width - pixels.shape[1], 0)
    if pad_h or pad_w:
        pixels = np.pad(
            pixels,
            ((pad_h // 2, (pad_h + 1) // 2), (pad_w // 2, (pad_w + 1) // 2), (0, 0)),
            constant_values=crop.get("fill", 0),
        )
    top = _centre_offset(pixels.shape[0] - height, crop["offset"])
    left = _centre_offset(pixels.shape[1] - width, crop["offset"])
    return pixels[top : top + height, left : left + width]


def _normalised(pixels: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    mean, std = np.asarray(spec["mean"]), np.asarray(spec["std"])
    return (pixels.astype(np.float64) * spec["rescale"] - mean) / std


def image_array(image: Image.Image, spec: dict[str, Any]) -> np.ndarray:
    """One RGB image as a C x H x W float32 array: resized, centre-cropped, scaled, normalised."""
    resize = spec.get("resize")
    if resize and "shortest_edge" in resize:
        size = shortest_edge_size(image.width, image.height, resize["shortest_edge"])
        image = image.resize(size, _resample(spec))
    elif resize and "keep_ratio" in resize:
        size = keep_ratio_size(image.width, image.height, resize["keep_ratio"])
        image = image.resize(size, _resample(spec))
    elif resize:
        image = image.resize((resize["width"], resize["height"]), _resample(spec))
    pixels = np.asarray(image)
    if spec.get("center_crop"):
        pixels = center_crop(pixels, spec["center_crop"])
    return _normalised(pixels, spec).transpose(2, 0, 1).astype(np.float32)


def naflex_size(height: int, width: int, patch: int, max_patches: int) -> tuple[int, int]:
    """The largest (height, width), each a whole number of patches (at least one), at one scale
    of the image, with at most max_patches patches: the scale found by bisection to 1e-5."""

    def scaled(scale: float, size: int) -> int:
        return max(patch, int(np.ceil(size * scale / patch)) * patch)

    low, high = 1e-6, 100.0
    while high - low >= 1e-5:
        scale = (low + high) / 2
        if (scaled(scale, height) / patch) * (scaled(scale, width) / patch) <= max_patches:
            low = scale
        else:
            high = scale
    return scaled(low, height), scaled(low, width)


def naflex_arrays(images: list[Image.Image], spec: dict[str, Any]) -> Arrays:
    """Each image resized to its patch grid, cut into flattened patches (row-major, each patch
    its rows x columns x channels), padded with zero patches to max_num_patches; the mask marks
    real patches and spatial_shapes holds each grid."""
    patch, most = spec["patch_size"], spec["max_num_patches"]
    values, masks, shapes = [], [], []
    for image in images:
        height, width = naflex_size(image.height, image.width, patch, most)
        pixels = _normalised(np.asarray(image.resize((width, height), _resample(spec))), spec)
        rows, cols = height // patch, width // patch
        patches = pixels.reshape(rows, patch, cols, patch, -1).transpose(0, 2, 1, 3, 4)
        patches = patches.reshape(rows * cols, -1)
        padded = np.zeros((most, patches.shape[1]))
        padded[: len(patches)] = patches
        values.append(padded.astype(np.float32))
        masks.append((np.arange(most) < len(patches)).astype(np.int32))
        shapes.append((rows, cols))
    return {
        spec["input"]: np.stack(values),
        spec["mask_input"]: np.stack(masks),
        spec["shapes_input"]: np.asarray(shapes, dtype=np.int64),
    }


# -- audio --------------------------------------------------------------------------------------
def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    mel = 3.0 * hz / 200.0
    log_region = hz >= 1000.0
    mel[log_region] = 15.0 + np.log(hz[log_region] / 1000.0) * 27.0 / np.log(6.4)
    return mel


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
    hz = 200.0 * mel / 3.0
    log_region = mel >= 15.0
    hz[log_region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mel[log_region] - 15.0))
    return hz


def mel_filters(spec: dict[str, Any]) -> np.ndarray:
    """(n_fft // 2 + 1) x n_mels triangular filters, equally spaced on the Slaney mel scale
    between f_min and f_max, each scaled to unit area (Slaney normalisation)."""
    bins = spec["n_fft"] // 2 + 1
    edges_mel = np.linspace(
        _hz_to_mel(np.array([spec["f_min"]]))[0],
        _hz_to_mel(np.array([spec["f_max"]]))[0],
        spec["n_mels"] + 2,
    )
    edges = _mel_to_hz(edges_mel)
    frequencies = np.linspace(0, spec["sampling_rate"] // 2, bins)
    slopes = edges[None, :] - frequencies[:, None]
    down = -slopes[:, :-2] / np.diff(edges)[:-1]
    up = slopes[:, 2:] / np.diff(edges)[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def repeat_padded(wave: np.ndarray, length: int, rule: str) -> np.ndarray:
    """A clip shorter than `length`: repeated whole ("repeatpad") or to the sample ("repeat"),
    then zero-padded to `length`."""
    if len(wave) >= length:
        return wave[:length]
    if rule == "repeatpad":
        wave = np.tile(wave, length // len(wave))
    elif rule == "repeat":
        wave = np.tile(wave, length // len(wave) + 1)[:length]
    return np.pad(wave, (0, length - len(wave)))


def log_mel(wave: np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """frames x n_mels float32 log-mel spectrogram of one clip, by the contract's record."""
    n_fft, hop = spec["n_fft"], spec["hop_length"]
    wave = repeat_padded(wave.astype(np.float64), spec["max_samples"], spec["padding"])
    wave = np.pad(wave, n_fft // 2, mode="reflect")
    frames = np.lib.stride_tricks.sliding_window_view(wave, n_fft)[::hop]
    window = np.hanning(n_fft + 1)[:-1]  # periodic
    # the extractor keeps the complex spectrum in single precision
    spectrum = np.fft.rfft(frames * window, axis=1).astype(np.complex64)
    power = np.abs(spectrum, dtype=np.float64) ** spec["power"]
    mel = np.maximum(spec["mel_floor"], power @ mel_filters(spec))
    return (10.0 * np.log10(np.maximum(mel, 1e-10))).astype(np.float32)
