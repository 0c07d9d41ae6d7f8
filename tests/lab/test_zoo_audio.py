"""The audio zoo (CLAP members on the generated audio world), built with the audio-tiny
profile: the same build, `zoo:` names one level below the zoo root, splits written again when
they are not committed, and `ptc paper` on it."""

from __future__ import annotations

import json
import shutil

import pytest

from conftest import tree_digest
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.errors import ModelNotFound
from ptc.lab.zoo import paper
from ptc.lab.zoo.build import build_zoo, profile_named, read_index

# One worker builds this file's audio zoo (a module fixture), not both.
pytestmark = pytest.mark.xdist_group("audio-zoo")

AUDIO_TINY = profile_named("audio-tiny")


@pytest.fixture(scope="module")
def audio_zoo(tmp_path_factory):
    """An image zoo root (empty index) with the audio zoo in its audio/ folder, as committed."""
    root = tmp_path_factory.mktemp("zoo")
    (root / "zoo.json").write_text(json.dumps({"members": {"img": {"ref": "hf:models/img"}}}))
    build_zoo(root / "audio", AUDIO_TINY, echo=lambda _: None)
    return root


def test_the_audio_zoo_records_clap_members_sources_and_descriptors(audio_zoo):
    index = read_index(audio_zoo / "audio")
    assert index["world_kind"] == "audio" and set(index["members"]) == {"clap-a", "clap-b"}
    bank = Bank(audio_zoo / "audio" / "bank")
    for name, record in index["members"].items():
        assert record["ref"].startswith("hf:") and set(record["quality"]) == set(AUDIO_TINY.tasks)
        for task in AUDIO_TINY.source_tasks:
            entry = bank.descriptor(task, f"{name}-s0")
            probes, classes = len(bank.task(task).probes), len(bank.task(task).classes)
            assert (
                tuple(entry.tensors["utd"].shape)
                == tuple(entry.tensors["source_affinity"].shape)
                == (probes, classes)
            )
        assert all(p.suffix == ".wav" for p in bank.task("pitch").probes)


def test_zoo_names_reach_members_of_the_zoo_one_level_down(audio_zoo, monkeypatch):
    monkeypatch.setenv("PTC_ZOO", str(audio_zoo))
    index = read_index(audio_zoo / "audio")
    clap = targets.load("zoo:clap-a")
    native = targets.load(index["members"]["clap-a"]["ref"], audio_zoo / "audio")
    assert clap.ref == "zoo:clap-a" and clap.input_fingerprint() == native.input_fingerprint()
    with pytest.raises(ModelNotFound, match="zoo:nope: not a member") as caught:
        targets.load("zoo:nope")
    assert caught.value.hint == "members: clap-a, clap-b, img"


def test_splits_that_are_not_committed_are_written_again_byte_for_byte(audio_zoo, tmp_path):
    copy = tmp_path / "audio"
    shutil.copytree(audio_zoo / "audio", copy)
    before = tree_digest(copy / "world" / "tasks")
    for task in AUDIO_TINY.tasks:
        for split in ("probes", "train", "test"):
            shutil.rmtree(copy / "world" / "tasks" / task / split)
    shutil.rmtree(copy / "world" / "pretrain")
    lines: list[str] = []
    build_zoo(copy, AUDIO_TINY, echo=lines.append)
    assert tree_digest(copy / "world" / "tasks") == before
    assert [line for line in lines if line.startswith("world: task")] == [
        f"world: task {t}" for t in AUDIO_TINY.tasks
    ]
    assert not any("pretrained" in line for line in lines)  # members were built: no corpus needed
    assert read_index(copy)["members"] == read_index(audio_zoo / "audio")["members"]


def test_the_paper_harness_runs_on_the_audio_zoo(audio_zoo):
    results = paper.run(audio_zoo / "audio", echo=lambda _: None)
    assert results["members"] == ["clap-a", "clap-b"] and results["control_tasks"] == ["noise"]
    assert results["linearity"]["max_rel_diff_fp64"] <= 1e-12
    assert results["certify"]["certified_changed"] == 0
    cells = results["addition"]["cells"]
    assert cells == len(AUDIO_TINY.members) * len(AUDIO_TINY.source_tasks) * len(AUDIO_TINY.seeds)
