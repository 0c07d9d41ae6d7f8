"""The zoo's generated worlds by kind: `image` (world.py) for image-text members, `audio`
(audio_world.py) for CLAP members. Each module offers the same names: TASKS (task -> classes,
templates), CONTROL_TASKS, IN_DISTRIBUTION, INPUT_KEY (what captions.jsonl calls an input),
write_world(root, size, seed, template_share) and write_task(root, task, size, seed)."""

from __future__ import annotations

import importlib

KINDS = {"image": "ptc.lab.zoo.world", "audio": "ptc.lab.zoo.audio_world"}


def world_module(kind: str):
    if kind not in KINDS:
        raise ValueError(f"unknown world kind {kind!r}; expected one of {', '.join(KINDS)}")
    return importlib.import_module(KINDS[kind])


SPLITS = ("probes", "train", "test")


def ensure_task(world_root, kind: str, size, seed: int, task: str) -> bool:
    """Write a task's folder again if any split is missing (splits a zoo does not commit come
    out byte for byte as first written: each task has its own random stream). True if written."""
    folder = world_root / "tasks" / task
    splits = (*SPLITS, "test-extra") if getattr(size, "test_extra", 0) else SPLITS
    if all((folder / split).is_dir() for split in splits) and (folder / "task.yaml").is_file():
        return False
    world_module(kind).write_task(world_root, task, size, seed)
    return True
