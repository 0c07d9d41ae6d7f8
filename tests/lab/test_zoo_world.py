"""The zoo's generated world: deterministic, split-disciplined, and style-shifted downstream."""

import dataclasses
import json
import random
import shutil

import numpy as np
import pytest
from PIL import Image

from conftest import tree_digest
from ptc.compiler.tasks.grid import load_task
from ptc.compiler.tasks.labelled import labelled_files
from ptc.errors import InputError
from ptc.lab.zoo.world import (
    CONTROL_TASKS,
    DIGITS,
    IN_DISTRIBUTION,
    PLAIN,
    SHIFTED,
    SPREAD_GREY,
    SPREAD_WASH,
    TASKS,
    TEST_DIGITS,
    Style,
    WorldSize,
    _digit_images,
    render,
    sample_scene,
    spread_style,
    task_style,
    write_task,
    write_world,
)

SMALL = WorldSize(pretrain=24, probes=6, train=2, test=2)


def test_the_world_is_a_pure_function_of_its_seed(tmp_path):
    write_world(tmp_path / "a", SMALL, seed=3)
    write_world(tmp_path / "b", SMALL, seed=3)
    write_world(tmp_path / "c", SMALL, seed=4)
    assert tree_digest(tmp_path / "a") == tree_digest(tmp_path / "b") != tree_digest(tmp_path / "c")


def test_task_files_load_with_every_class_labelled_and_a_control_task(tmp_path):
    files = write_world(tmp_path, SMALL)
    assert len(files) >= 6 and set(CONTROL_TASKS) < set(files)
    for name, path in files.items():
        task = load_task(path)
        assert task.classes == TASKS[name][0] and len(task.probes) == SMALL.probes
        for split, count in (("train", SMALL.train), ("test", SMALL.test)):
            pairs = labelled_files(path.parent / split, task.classes)
            assert sorted({label for _, label in pairs}) == list(range(len(task.classes)))
            assert len(pairs) == count * len(task.classes)
    captions = [
        json.loads(line)
        for line in (tmp_path / "pretrain" / "captions.jsonl").read_text().splitlines()
    ]
    assert len(captions) == SMALL.pretrain and all(
        (tmp_path / "pretrain" / c["image"]).is_file() for c in captions
    )


def test_held_out_digits_never_come_from_the_fitting_pool():
    images, targets = _digit_images()
    test_pool = list(range(len(images) - TEST_DIGITS, len(images)))
    rng = random.Random(0)
    for digit in DIGITS:
        scene = sample_scene(rng, test_pool, targets, fixed={"digit": digit})
        assert (
            scene.digit_index in test_pool
            and DIGITS[targets[scene.digit_index]] == digit == scene.digit
        )


def test_downstream_splits_are_drawn_in_a_style_pretraining_never_saw(tmp_path):
    write_world(tmp_path, SMALL)

    def brightness(paths):
        return np.mean([np.asarray(Image.open(p), dtype=float).mean() for p in paths])

    plain = brightness(sorted((tmp_path / "pretrain" / "images").glob("*.png")))
    shifted = brightness(sorted((tmp_path / "tasks" / "shape" / "probes").glob("*.png")))
    assert shifted > plain + 40  # the shifted backgrounds are brighter than any pretraining one


def test_task_splits_are_the_same_with_or_without_a_pretraining_corpus(tmp_path):
    write_world(tmp_path / "with", SMALL, seed=5)
    write_world(
        tmp_path / "without",
        WorldSize(pretrain=0, probes=SMALL.probes, train=SMALL.train, test=SMALL.test),
        seed=5,
    )
    assert not (tmp_path / "without" / "pretrain").exists()
    assert tree_digest(tmp_path / "with" / "tasks") == tree_digest(tmp_path / "without" / "tasks")


def test_a_spread_corpus_holds_the_plain_corpus_scenes_and_captions_drawn_otherwise(tmp_path):
    write_world(tmp_path / "plain", SMALL, seed=2)
    write_world(tmp_path / "spread", dataclasses.replace(SMALL, pretrain_style="spread"), seed=2)
    plain, spread = tree_digest(tmp_path / "plain"), tree_digest(tmp_path / "spread")
    images = [name for name in plain if name.startswith("pretrain/images/")]
    assert len(images) == SMALL.pretrain
    # every image redrawn
    assert sum(plain[name] != spread[name] for name in images) == SMALL.pretrain
    # captions and tasks alike
    assert all(plain[name] == spread[name] for name in plain if name not in images)
    with pytest.raises(InputError, match="unknown pretraining style 'noir'"):
        write_world(tmp_path / "noir", dataclasses.replace(SMALL, pretrain_style="noir"))


def test_the_spread_of_styles_stops_short_of_the_downstream_shift_on_every_axis():
    rng = random.Random(0)
    styles = [spread_style(rng) for _ in range(500)]
    assert all(
        max(s.grey) < min(SHIFTED.grey) and s.wash < SHIFTED.wash and s.stroke < SHIFTED.stroke
        for s in styles
    )
    washes = [
        s.wash for s in styles
    ]  # and it is a spread: from plain's unwashed colours to well past them
    assert min(washes) < 0.01 and max(washes) > 0.25 and min(styles[0].grey) < min(PLAIN.grey)


def test_the_committed_zoos_task_splits_come_out_of_its_seed_byte_for_byte(tmp_path):
    """What `ptc zoo build` regenerates (the train splits are not committed) is drawn by the
    same code as the committed probes and test splits: one shifted and one plain-style task,
    written again at the committed zoo's sizes, match every committed file."""
    from pathlib import Path

    from ptc.lab.zoo.world import write_task

    committed = Path(__file__).resolve().parents[2] / "zoo"
    index = json.loads((committed / "zoo.json").read_text())
    size = WorldSize(
        **{k: v for k, v in index["world"].items() if k in WorldSize.__dataclass_fields__}
    )
    for task in ("shape", "count-plain"):
        write_task(tmp_path, task, size, index["seed"])
        ours, theirs = (
            tree_digest(tmp_path / "tasks" / task),
            tree_digest(committed / "world" / "tasks" / task),
        )
        shared = set(ours) & set(theirs)
        # every committed file: probes, test split, task file
        assert len(shared) == len(theirs) > size.probes
        assert all(ours[name] == theirs[name] for name in shared)


def _outside_pretraining(style: Style) -> bool:
    """Not a style pretraining draws, plain or spread: off its range on some axis."""
    return (
        style.noise > 0
        or style.tint != (1, 1, 1)
        or style.cast != (1, 1, 1)
        or style.stroke > 1
        or style.wash > SPREAD_WASH
        or min(style.grey) > max(SPREAD_GREY)
        or max(style.grey) < min(SPREAD_GREY)
    )


def test_a_per_task_shift_draws_each_task_in_a_style_of_its_own(tmp_path):
    shared, per_task = SMALL, dataclasses.replace(SMALL, downstream_shift="per-task")
    write_world(tmp_path / "shared", shared, seed=1)
    write_world(tmp_path / "per-task", per_task, seed=1)
    for plain in IN_DISTRIBUTION:
        write_task(tmp_path / "shared", plain, shared, seed=1)
        write_task(tmp_path / "per-task", plain, per_task, seed=1)
    a, b = tree_digest(tmp_path / "shared"), tree_digest(tmp_path / "per-task")
    assert a.keys() == b.keys()
    unchanged = {
        name.split("/")[1]
        for name in a
        if name.startswith("tasks/") and a[name] == b[name] and name.endswith(".png")
    }
    # Shape keeps the shared shift, the plain variants stay plain; every other task is redrawn,
    # each probe of it; the pretraining corpus and every task file are untouched.
    assert unchanged == {"shape", *IN_DISTRIBUTION}
    for task in set(TASKS) - {"shape"}:
        probes = [name for name in a if name.startswith(f"tasks/{task}/probes/")]
        assert probes and all(a[name] != b[name] for name in probes), task
    assert all(
        a[name] == b[name]
        for name in a
        if not name.endswith(".png") or name.startswith("pretrain/")
    )
    styles = {task: task_style(task, "per-task") for task in TASKS}
    assert len(set(styles.values())) == len(TASKS)  # no two tasks share a domain
    assert all(_outside_pretraining(style) for style in styles.values())
    assert all(task_style(plain, "per-task") == PLAIN for plain in IN_DISTRIBUTION)
    with pytest.raises(InputError, match="unknown downstream shift 'wild'"):
        write_task(tmp_path / "wild", "colour", dataclasses.replace(SMALL, downstream_shift="wild"))
    assert not (tmp_path / "wild").exists()


def test_a_false_colour_shift_redraws_colour_alone(tmp_path):
    """Colour through a false-colour sensor; every other task keeps the shared shift byte for byte."""
    shared, false_colour = SMALL, dataclasses.replace(SMALL, downstream_shift="false-colour")
    write_world(tmp_path / "shared", shared, seed=1)
    write_world(tmp_path / "false-colour", false_colour, seed=1)
    a, b = tree_digest(tmp_path / "shared"), tree_digest(tmp_path / "false-colour")
    assert a.keys() == b.keys()
    changed = {name.split("/")[1] for name in a if a[name] != b[name]}
    assert changed == {"colour"}
    colour = [name for name in a if name.startswith("tasks/colour/") and name.endswith(".png")]
    assert all(a[name] != b[name] for name in colour)
    assert (
        task_style("colour", "false-colour").false_colour > 0
        and task_style("shape", "false-colour") == SHIFTED
    )


def test_a_cast_scales_every_pixel_and_noise_has_its_sigma_without_moving_the_scene_stream():
    images, targets = _digit_images()
    scene = sample_scene(random.Random(4), list(range(100)), targets)

    def drawn(style):
        rng = random.Random(9)
        image = render(scene, rng, images, style).astype(float)
        return image, rng.random()  # where the scene stream stands after drawing

    plain, after_plain = drawn(PLAIN)
    cast, after_cast = drawn(dataclasses.replace(PLAIN, cast=(0.75, 0.9, 1.3)))
    assert after_cast == after_plain  # same jitter and layout: only the cast differs
    expected = plain * np.array((0.75, 0.9, 1.3))
    inside = expected < 254
    assert np.abs(cast - expected)[inside].max() <= 2.0  # uint8 truncation on both sides
    noisy, _ = drawn(dataclasses.replace(PLAIN, noise=20.0))
    residual = (noisy - plain)[(plain > 60) & (plain < 195)]  # away from clipping at 0 and 255
    assert abs(residual.std() - 20.0) < 2.0 and abs(residual.mean()) < 1.5
    # False colour: each channel takes a share of the next band's (R from B, G from R, B from G).
    mixed, after_mixed = drawn(dataclasses.replace(PLAIN, false_colour=0.32))
    assert after_mixed == after_plain
    # uint8 truncation
    assert np.abs(mixed - (0.68 * plain + 0.32 * plain[..., [2, 0, 1]])).max() <= 1.0
    assert np.abs(mixed - plain).max() > 30  # the scene's coloured shapes do move
    negative, _ = drawn(dataclasses.replace(PLAIN, negative=True))
    assert np.abs(negative - (255 - plain)).max() <= 1.0  # uint8 truncation


def test_extra_train_images_are_added_without_changing_any_other_file(tmp_path):
    write_world(tmp_path / "base", SMALL, seed=2)
    write_world(tmp_path / "more", dataclasses.replace(SMALL, train_extra=3), seed=2)
    base, more = tree_digest(tmp_path / "base"), tree_digest(tmp_path / "more")
    assert all(more.get(name) == digest for name, digest in base.items())  # every file as it was
    added = sorted(set(more) - set(base))
    expected = sorted(
        f"tasks/{task}/train/{label}/{i:04d}.png"
        for task, (classes, _) in TASKS.items()
        for label in classes
        for i in range(SMALL.train, SMALL.train + 3)
    )
    assert added == expected
    for task, path in {
        task: tmp_path / "more" / "tasks" / task / "task.yaml" for task in TASKS
    }.items():
        pairs = labelled_files(path.parent / "train", load_task(path).classes)
        assert len(pairs) == (SMALL.train + 3) * len(TASKS[task][0])
    with pytest.raises(InputError, match="train_extra is -1"):
        write_task(tmp_path / "less", "colour", dataclasses.replace(SMALL, train_extra=-1))


def test_extra_test_images_go_to_a_folder_of_their_own_and_change_no_other_file(tmp_path):
    """The committed test split stays as it is; the extra held-out images (what narrows the
    report's intervals) come from a stream of their own, and ensure_task writes them when missing."""
    from ptc.lab.zoo.worlds import ensure_task

    write_world(tmp_path / "base", SMALL, seed=2)
    bigger = dataclasses.replace(SMALL, test_extra=3)
    write_world(tmp_path / "more", bigger, seed=2)
    base, more = tree_digest(tmp_path / "base"), tree_digest(tmp_path / "more")
    assert all(more.get(name) == digest for name, digest in base.items())
    added = sorted(set(more) - set(base))
    assert added == sorted(
        f"tasks/{task}/test-extra/{label}/{i:04d}.png"
        for task, (classes, _) in TASKS.items()
        for label in classes
        for i in range(3)
    )
    # Not the test split's images again: a stream of its own.
    colour = tmp_path / "more" / "tasks" / "colour"
    label = TASKS["colour"][0][0]
    assert (colour / "test-extra" / label / "0000.png").read_bytes() != (
        colour / "test" / label / "0000.png"
    ).read_bytes()
    shutil.rmtree(colour / "test-extra")
    assert ensure_task(tmp_path / "more", "image", bigger, 2, "colour")
    assert tree_digest(tmp_path / "more") == more
    assert not ensure_task(tmp_path / "more", "image", bigger, 2, "colour")
    with pytest.raises(InputError, match="test_extra is -1"):
        write_task(tmp_path / "less", "colour", dataclasses.replace(SMALL, test_extra=-1))
