"""The zoo's generated worlds by kind: `image` (world.py) for image-text members, `audio`
(audio_world.py) for CLAP members. Each module offers the same names: TASKS (task -> classes,
templates), CONTROL_TASKS, IN_DISTRIBUTION, INPUT_KEY (what captions.jsonl calls an input),
write_world(root, size, seed, template_share) and write_task(root, task, size, seed)."""

from __future__ import annotations

import importlib

KINDS = {"image": "compiler.zoo.world", "audio": "compiler.zoo.audio_world"}


def world_module(kind: str):
    if kind not in KINDS:
        raise ValueError(f"unknown world kind {kind!r}; expected one of {', '.join(KINDS)}")
    return importlib.import_module(KINDS[kind])
