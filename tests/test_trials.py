"""The zoo trials' own guards (benchmarks/rebuild_trial.py, source_trial.py): a rebuilt zoo must
score on the committed task splits, its profile must change only what the trial says, and a
trial stops at the first member whose class prompts collapse."""

from __future__ import annotations

import dataclasses

import pytest

import targets
from benchmarks.rebuild_trial import SHAPES, changed_profile, different_split_files, trial_name
from benchmarks.source_trial import build_and_report
from compiler.zoo import build
from compiler.zoo.build import profile_named, read_index, write_world_once

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
    test_file = sorted((tmp_path / "trial" / "world" / "tasks" / "count" / "test").rglob("*.png"))[0]
    test_file.unlink()
    assert different_split_files(tmp_path / "committed", tmp_path / "trial") == sorted(
        str(p.relative_to(tmp_path / "trial")) for p in (probe, test_file))


def test_longer_multiplies_every_members_steps_and_nothing_else():
    full = profile_named("full")
    longer = changed_profile(full, pretrain=None, longer=1.5)
    steps = {m.name: m.pretrain["steps"] for m in longer.members}
    assert steps == {m.name: round(1.5 * m.pretrain["steps"]) for m in full.members}
    assert longer.world == full.world
    assert [dataclasses.replace(m, pretrain={}) for m in longer.members] == \
           [dataclasses.replace(m, pretrain={}) for m in full.members]
    # A member without steps of its own trains for the profile's default, times the factor.
    assert {m.pretrain["steps"] for m in changed_profile(TINY, None, 2).members} == {2 * TINY.pretrain.steps}
    assert trial_name(None, 1.5) == "longer-1.5" and trial_name(48000, 1) == "corpus-48000"


def test_a_trial_stops_at_the_first_member_whose_prompts_collapse(tmp_path, monkeypatch):
    quick = dataclasses.replace(TINY, world=dataclasses.replace(TINY.world, pretrain=40), finetune_steps=2,
                                members=tuple(dataclasses.replace(m, pretrain={"steps": 2}) for m in TINY.members))
    monkeypatch.setattr(build, "MAX_PROMPT_COSINE", -1.0)  # no mean cosine is below it: every task collapses
    with pytest.raises(SystemExit, match=r"collapsed \(mean cosine over -1.0\) on clip/colour, clip/count, "
                                         r"clip/background: .*no report written"):
        build_and_report(tmp_path / "zoo", quick, tmp_path / "out", "trial")
    assert list(read_index(tmp_path / "zoo")["members"]) == ["clip"]
    assert not (tmp_path / "zoo" / "models" / "vit").exists()
    assert not (tmp_path / "out").exists()


def test_shapes_swap_every_members_options_and_each_shape_builds_at_its_declared_width(tmp_path):
    full = profile_named("full")
    wide = changed_profile(full, pretrain=None, longer=1, shapes="wide-1.5")
    assert {m.name: m.options for m in wide.members} == SHAPES["wide-1.5"]
    assert [dataclasses.replace(m, options={}) for m in wide.members] == \
           [dataclasses.replace(m, options={}) for m in full.members]
    assert trial_name(None, 1, "wide-1.5") == "wide-1.5"
    # Each member's builder takes its options, and the model it saves embeds at the width the
    # table says (the text side read through the same loader the zoo uses).
    declared = {"clip": 96, "siglip": 120, "vit": 72, "eva": 108}
    for member in wide.members:
        folder = build._builder(member)(tmp_path / member.name, seed=0, **member.options)
        encoder = targets.load(f"{member.scheme}:{folder}")
        assert encoder.embed_prompts(["a photo of a red circle."]).shape == (1, declared[member.name]), member.name
    with pytest.raises(SystemExit, match=r"shapes 'wide-1.5' name members \['clip', 'eva', 'siglip', 'vit'\], "
                                         r"the profile has \['clip', 'vit'\]"):
        changed_profile(TINY, None, 1, "wide-1.5")
