"""The zoo trials' own guards (benchmarks/rebuild_trial.py, source_trial.py, shift_trial.py): a
rebuilt zoo must score on the committed task splits, its profile must change only what the trial
says, a trial stops at the first member whose class prompts collapse, and a shift trial keeps the
members and nothing drawn from the old splits."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import tree_digest
from ptc import targets
from ptc.errors import InputError
from ptc.lab.benchmarks import source_trial
from ptc.lab.benchmarks.rebuild_trial import (
    SHAPES,
    changed_profile,
    different_split_files,
    trial_name,
)
from ptc.lab.benchmarks.shift_trial import check_unchanged_splits, copy_members, fails_requirement
from ptc.lab.benchmarks.source_trial import build_and_report
from ptc.lab.zoo import build
from ptc.lab.zoo.build import build_zoo, profile_named, read_index, write_world_once
from ptc.lab.zoo.world import TASKS, write_task

# One worker builds the tiny zoo these tests share (a session fixture), not both.
pytestmark = pytest.mark.xdist_group("zoo")

TINY = profile_named("tiny")


def test_a_larger_corpus_keeps_the_task_splits_and_a_changed_file_is_named(tmp_path):
    small = dataclasses.replace(TINY, world=dataclasses.replace(TINY.world, pretrain=40))
    write_world_once(tmp_path / "committed", small)
    trial = changed_profile(small, pretrain=120, longer=1)
    write_world_once(tmp_path / "trial", trial)
    assert len(list((tmp_path / "trial" / "world" / "pretrain" / "images").iterdir())) == 120
    assert different_split_files(tmp_path / "committed", tmp_path / "trial") == []

    probe = sorted((tmp_path / "trial" / "world" / "tasks" / "colour" / "probes").iterdir())[3]
    probe.write_bytes(probe.read_bytes()[:-1] + b"\0")
    test_file = sorted((tmp_path / "trial" / "world" / "tasks" / "count" / "test").rglob("*.png"))[
        0
    ]
    test_file.unlink()
    assert different_split_files(tmp_path / "committed", tmp_path / "trial") == sorted(
        str(p.relative_to(tmp_path / "trial")) for p in (probe, test_file)
    )


def test_longer_multiplies_every_members_steps_and_nothing_else():
    full = profile_named("full")
    longer = changed_profile(full, pretrain=None, longer=1.5)
    steps = {m.name: m.pretrain["steps"] for m in longer.members}
    assert steps == {m.name: round(1.5 * m.pretrain["steps"]) for m in full.members}
    assert longer.world == full.world
    assert [dataclasses.replace(m, pretrain={}) for m in longer.members] == [
        dataclasses.replace(m, pretrain={}) for m in full.members
    ]
    # A member without steps of its own trains for the profile's default, times the factor.
    assert {m.pretrain["steps"] for m in changed_profile(TINY, None, 2).members} == {
        2 * TINY.pretrain.steps
    }
    assert trial_name(None, 1.5) == "longer-1.5" and trial_name(48000, 1) == "corpus-48000"


def test_a_trial_stops_at_the_first_member_whose_prompts_collapse(tmp_path, monkeypatch):
    quick = dataclasses.replace(
        TINY,
        world=dataclasses.replace(TINY.world, pretrain=40),
        finetune_steps=2,
        members=tuple(dataclasses.replace(m, pretrain={"steps": 2}) for m in TINY.members),
    )
    # no mean cosine is below it: every task collapses
    monkeypatch.setattr(build, "MAX_PROMPT_COSINE", -1.0)
    with pytest.raises(
        SystemExit,
        match=r"collapsed \(mean cosine over -1.0\) on clip/colour, clip/count, "
        r"clip/background: .*no report written",
    ):
        build_and_report(tmp_path / "zoo", quick, tmp_path / "out", "trial")
    assert list(read_index(tmp_path / "zoo")["members"]) == ["clip"]
    assert not (tmp_path / "zoo" / "models" / "vit").exists()
    assert not (tmp_path / "out").exists()


def test_shapes_swap_every_members_options_and_each_shape_builds_at_its_declared_width(tmp_path):
    full = profile_named("full")
    wide = changed_profile(full, pretrain=None, longer=1, shapes="wide-1.5")
    assert {m.name: m.options for m in wide.members} == SHAPES["wide-1.5"]
    assert [dataclasses.replace(m, options={}) for m in wide.members] == [
        dataclasses.replace(m, options={}) for m in full.members
    ]
    assert trial_name(None, 1, "wide-1.5") == "wide-1.5"
    # Each member's builder takes its options, and the model it saves embeds at the width the
    # table says (the text side read through the same loader the zoo uses).
    declared = {"clip": 96, "siglip": 120, "vit": 72, "eva": 108}
    for member in wide.members:
        folder = build._builder(member)(tmp_path / member.name, seed=0, **member.options)
        encoder = targets.load(f"{member.scheme}:{folder}")
        assert encoder.embed_prompts(["a photo of a red circle."]).shape == (
            1,
            declared[member.name],
        ), member.name
    with pytest.raises(
        SystemExit,
        match=r"shapes 'wide-1.5' name members \['clip', 'eva', 'siglip', 'vit'\], "
        r"the profile has \['clip', 'vit'\]",
    ):
        changed_profile(TINY, None, 1, "wide-1.5")


@pytest.mark.parametrize(
    "shift, redrawn", [("per-task", set(TINY.tasks)), ("false-colour", {"colour"})]
)
def test_a_shift_trial_keeps_the_members_and_draws_every_split_again_in_its_shift(
    zoo, tmp_path, shift, redrawn
):
    work = tmp_path / "trial"
    trial = dataclasses.replace(TINY, world=dataclasses.replace(TINY.world, downstream_shift=shift))
    copy_members(zoo, work, trial)
    assert tree_digest(work / "models") == tree_digest(zoo / "models")
    assert not any(
        (work / part).exists() for part in ("sources", "bank", "world/tasks", "world/pretrain")
    )
    index = read_index(work)
    assert index["world"]["downstream_shift"] == shift
    assert all(not {"sources", "quality"} & set(record) for record in index["members"].values())
    write_world_once(work, trial)
    for task in TINY.tasks:  # every split written again, byte for byte the trial world's
        write_task(tmp_path / "expected", task, trial.world, trial.seed)
        assert tree_digest(work / "world" / "tasks" / task) == tree_digest(
            tmp_path / "expected" / "tasks" / task
        )
        same = tree_digest(work / "world" / "tasks" / task) == tree_digest(
            zoo / "world" / "tasks" / task
        )
        assert same is (task not in redrawn), task
    check_unchanged_splits(zoo, work, trial)  # what the trial itself checks: passes here
    kept = next((t for t in TINY.tasks if t not in redrawn), None)
    if kept:  # and stops once a task the shift leaves alone comes out otherwise
        next((work / "world" / "tasks" / kept / "probes").iterdir()).write_bytes(
            b"not the committed probe"
        )
        with pytest.raises(
            SystemExit,
            match=rf"1 files of tasks the {shift} shift leaves alone differ .*{kept}/probes",
        ):
            check_unchanged_splits(zoo, work, trial)
    # The trial zoo cannot be taken for (or finished as) the shared world's.
    with pytest.raises(
        InputError,
        match=rf"this zoo's world is .*'downstream_shift': '{shift}'.*; the tiny profile",
    ):
        build_zoo(work, TINY, echo=lambda _: None)


@pytest.mark.parametrize(
    "case, figures, before, chance, plain, fails",
    [
        # The trial's own check (train split; clip, eva, siglip, vit; results/trials/README.md).
        (
            "count: at chance, as in the shared shift",
            [0.206, 0.25, 0.281, 0.219],
            [0.242, 0.283, 0.263, 0.267],
            0.25,
            None,
            False,
        ),
        (
            "colour drawn dark: read as in the plain style",
            [0.964, 0.886, 0.943, 0.875],
            [0.614, 0.538, 0.279, 0.533],
            1 / 7,
            [0.989, 0.939, 0.954, 0.943],
            True,
        ),
        (
            "colour under a cool cast",
            [0.636, 0.4, 0.157, 0.729],
            [0.614, 0.538, 0.279, 0.533],
            1 / 7,
            [0.989, 0.939, 0.954, 0.943],
            False,
        ),
        (
            "at chance where the shared shift was not",
            [0.25, 0.26, 0.24, 0.5],
            [0.35, 0.383, 0.3, 0.383],
            0.25,
            None,
            True,
        ),
        (
            "near the ceiling without a plain variant",
            [0.9, 0.88, 0.86, 0.87],
            [0.7, 0.6, 0.6, 0.7],
            0.5,
            None,
            True,
        ),
    ],
)
def test_a_new_style_fails_where_it_is_read_at_chance_anew_or_as_well_as_the_plain_style(
    case, figures, before, chance, plain, fails
):
    assert fails_requirement(figures, before, chance, plain) is fails, case


def test_a_dropout_trial_names_a_member_whose_lora_cannot_take_it_before_fine_tuning_anything(
    zoo, tmp_path, monkeypatch
):
    """zoo:vit's LoRA adapts open_clip's fused in_proj_weight, a parameter peft cannot drop out:
    the trial says so up front, not after every earlier member's sources."""
    work = tmp_path / "work"
    argv = ["source_trial", "--zoo", str(zoo), "--work", str(work), "--lora-dropout", "0.1"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(
        SystemExit,
        match=r"^open_clip:local-dir:models/vit: LoRA dropout needs LoRA on modules.*"
        r"in_proj_weight.*name the other members with --members\)$",
    ):
        source_trial.main()
    assert not work.exists()
    called = []
    monkeypatch.setattr(source_trial, "build_and_report", lambda *args: called.append(args))
    monkeypatch.setattr("sys.argv", [*argv, "--members", "clip"])
    source_trial.main()  # clip's LoRA is on modules: the trial goes ahead
    assert called and (work / "zoo.json").is_file()


def test_an_extra_train_trial_grows_only_the_train_splits_and_its_control_keeps_the_sources(
    zoo, tmp_path, monkeypatch
):
    called = []
    monkeypatch.setattr(
        source_trial,
        "build_and_report",
        lambda work, profile, out, name: called.append((profile.world.train_extra, name)),
    )
    for keep, work in ((True, tmp_path / "control"), (False, tmp_path / "trial")):
        monkeypatch.setattr(
            "sys.argv",
            [
                "source_trial",
                "--zoo",
                str(zoo),
                "--work",
                str(work),
                "--train-extra",
                "2",
                *(["--keep-sources"] if keep else []),
            ],
        )
        source_trial.main()
        assert read_index(work)["world"]["train_extra"] == 2
        for task in TINY.tasks:
            ours, theirs = (tree_digest(root / "world" / "tasks" / task) for root in (work, zoo))
            # probes, test, train
            assert all(ours.get(name) == digest for name, digest in theirs.items()), task
            classes = len(TASKS[task][0])
            assert len(set(ours) - set(theirs)) == 2 * classes and all(
                "/train/" in f"/{n}" for n in set(ours) - set(theirs)
            )
        # the control scores the committed ones
        assert any((work / "sources").rglob("adapter_config.json")) is keep
    assert called == [(2, "train-extra-2-control"), (2, "train-extra-2")]
    monkeypatch.setattr(
        "sys.argv",
        [
            "source_trial",
            "--zoo",
            str(zoo),
            "--work",
            str(tmp_path / "x"),
            "--steps",
            "5",
            "--keep-sources",
        ],
    )
    with pytest.raises(
        SystemExit, match="--keep-sources is --train-extra's control: it takes --train-extra alone"
    ):
        source_trial.main()
    assert not (tmp_path / "x").exists()


def test_the_one_standard_error_rule_picks_the_largest_ridge_within_an_error_of_the_best():
    from ptc.lab.benchmarks.ridge_criterion import one_standard_error_choice

    oracle = {
        1.0: [1.0, 2.0, 3.0, 4.0],
        0.01: [9.0, 11.0, 10.0, 12.0],
        0.001: [10.0, 11.0, 11.0, 12.0],
        1e-4: [15.0, 15.0, 15.0, 15.0],
    }
    random_utd = {1.0: 0.0, 0.01: -0.2, 0.001: -0.9, 1e-4: -1.7}  # 1e-4 is outside Random-UTD's bar
    # Best eligible: 0.001 (mean 11); 0.01 trails it by 0.5 per cell on average, with a paired error
    # of std(1, 0, 1, 0) / 2 = 0.29: outside one error, so 0.001 stays. 1.0 trails by 8.5.
    assert one_standard_error_choice(oracle, random_utd) == 0.001
    oracle[0.01] = [10.0, 10.0, 11.5, 12.0]  # now 0.125 behind with an error of 0.31: within
    assert one_standard_error_choice(oracle, random_utd) == 0.01


def test_the_readability_benchmark_reads_zero_shot_as_ptc_eval_does(zoo, tmp_path):
    """benchmarks/readable_shift: its zero-shot figure on images it draws is what the product's
    evaluation scores on them, and every style draws the same scenes' labels."""
    from ptc.compiler.verify.evaluate import zero_shot_accuracy
    from ptc.lab.benchmarks import readable_shift
    from ptc.lab.zoo.paper import Zoo

    harness = Zoo(zoo, split="train")
    readable_shift.draw(tmp_path / "shared", "colour", readable_shift.SHIFTED)
    readable_shift.draw(tmp_path / "false", "colour", readable_shift.STYLES["false colour 0.32"])
    assert tree_digest(tmp_path / "shared").keys() == tree_digest(tmp_path / "false").keys()
    zero_shot, probe = readable_shift.read(harness, "clip", "colour", tmp_path / "false")
    encoder = harness.view("clip").encoder
    expected = zero_shot_accuracy(
        encoder, harness.bank.task("colour"), tmp_path / "false", progress=False
    )
    assert zero_shot == pytest.approx(expected["accuracy"], abs=1e-6) and 0.0 <= probe <= 1.0
