"""The offline zoo, built with the tiny profile: its index and quality report, `zoo:` names,
resuming an interrupted build, a bank that moves with its probes, and `ptc paper`."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch

from conftest import run_ptc, tree_digest
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.verify.evaluate import zero_shot_accuracy
from ptc.errors import ModelNotFound
from ptc.lab.zoo import paper, report
from ptc.lab.zoo.build import build_zoo, profile_named, read_index

# One worker builds the tiny zoo these tests share (a session fixture), not both.
pytestmark = pytest.mark.xdist_group("zoo")

TINY = profile_named("tiny")


@pytest.fixture(scope="session")
def results(zoo):
    return paper.run(zoo, echo=lambda _: None)


def test_the_index_records_every_member_source_and_quality_figure(zoo):
    index = read_index(zoo)
    assert index["profile"] == "tiny" and set(index["members"]) == {m.name for m in TINY.members}
    bank = Bank(zoo / "bank")
    for name, record in index["members"].items():
        assert set(record["quality"]) == set(TINY.tasks)
        for task, quality in record["quality"].items():
            assert 0 <= quality["zero_shot"] <= 1 and quality["chance"] == pytest.approx(
                1 / len(bank.task(task).classes), abs=1e-4
            )
            assert -1 <= quality["prompt_cosine"] <= 1
        assert set(record["sources"]) == {
            f"{t}-s{s}" for t in TINY.source_tasks for s in TINY.seeds
        }
        for task in TINY.source_tasks:
            assert {f"{name}-s{s}" for s in TINY.seeds} <= set(bank.descriptor_ids(task))
        assert not any(
            key.startswith(f"{c}-") for c in TINY.control_tasks for key in record["sources"]
        )
        expected_device = (
            f"cuda: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else "cpu"
        )
        assert record["pretrain"]["device"] == expected_device
        for entry in record["sources"].values():
            assert entry["finetune"]["device"] == expected_device
            # the adapter names the member as the zoo does (root-relative), not the folder it was built in
            config = json.loads((zoo / entry["adapter"] / "adapter_config.json").read_text())
            assert config["base_model_name_or_path"] == record["ref"] and not record["ref"].split(
                ":", 1
            )[1].startswith("/")


def test_zoo_names_load_the_members_native_checkpoints(zoo, monkeypatch):
    monkeypatch.setenv("PTC_ZOO", str(zoo))
    index = read_index(zoo)
    for name, record in index["members"].items():
        by_name, native = targets.load(f"zoo:{name}"), targets.load(record["ref"], zoo)
        assert (
            by_name.ref == f"zoo:{name}"
            and by_name.input_fingerprint() == native.input_fingerprint()
        )
    with pytest.raises(ModelNotFound, match=r"zoo:nope: not a member of the zoo at ") as caught:
        targets.load("zoo:nope")
    assert caught.value.hint == "members: clip, vit"
    monkeypatch.setenv("PTC_ZOO", str(zoo / "missing"))
    with pytest.raises(ModelNotFound, match=r"no zoo at .*missing \(looked for .*zoo\.json\)"):
        targets.load("zoo:clip")


def test_a_finished_build_does_nothing_and_an_interrupted_one_redoes_only_what_is_missing(
    zoo, tmp_path
):
    copy = tmp_path / "zoo"
    shutil.copytree(zoo, copy)
    before = tree_digest(copy)
    lines: list[str] = []
    build_zoo(copy, TINY, echo=lines.append)
    assert lines == [] and tree_digest(copy) == before
    # Interrupt after one source: its adapter and descriptor are gone, and the index forgot it.
    member, key = TINY.members[0].name, f"{TINY.source_tasks[0]}-s{TINY.seeds[-1]}"
    shutil.rmtree(copy / "sources" / member / key)
    (
        copy
        / "bank"
        / "descriptors"
        / TINY.source_tasks[0]
        / f"{member}-s{TINY.seeds[-1]}.safetensors"
    ).unlink()
    index = read_index(copy)
    del index["members"][member]["sources"][key]
    (copy / "zoo.json").write_text(json.dumps(index))
    build_zoo(copy, TINY, echo=lines.append)
    assert len(lines) == 1 and lines[0].strip().startswith(f"{member} {key}: fine-tuned")
    # Deterministic, and the adapter names its base by the zoo's reference, not the build folder:
    # the source redone in another folder is the same bytes, config and model card included.
    # ptc's ownership marker of each adapter folder records file times: bookkeeping, not the source
    marker = lambda digest: {k: v for k, v in digest.items() if not k.endswith(".ptc-output.json")}  # noqa: E731
    assert marker(tree_digest(copy / "sources")) == marker(tree_digest(zoo / "sources"))
    assert tree_digest(copy / "bank" / "descriptors") == tree_digest(zoo / "bank" / "descriptors")


def test_a_build_stopped_mid_way_keeps_the_record_of_every_source_it_finished(
    zoo, tmp_path, monkeypatch
):
    """A device run's build killed by its time limit once lost the records (fine-tuning figures)
    of sources whose adapters were on disk: the index is now written after each source it records."""
    from ptc.lab.zoo import build

    copy = tmp_path / "zoo"
    shutil.copytree(zoo, copy)
    member, task = TINY.members[0].name, TINY.source_tasks[0]
    index = read_index(copy)
    keys = [f"{task}-s{seed}" for seed in TINY.seeds]
    for key, seed in zip(keys, TINY.seeds):
        shutil.rmtree(copy / "sources" / member / key)
        (copy / "bank" / "descriptors" / task / f"{member}-s{seed}.safetensors").unlink()
        del index["members"][member]["sources"][key]
    (copy / "zoo.json").write_text(json.dumps(index))
    real, calls = build.finetune_lora, []

    def stopped_on_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(build, "finetune_lora", stopped_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        build_zoo(copy, TINY, echo=lambda _: None)
    sources = read_index(copy)["members"][member]["sources"]
    # figures included
    assert sources[keys[0]] == read_index(zoo)["members"][member]["sources"][keys[0]]
    assert keys[1] not in sources


def _without_member(root, name: str) -> None:
    shutil.rmtree(root / "models" / name)
    shutil.rmtree(root / "sources" / name)
    for path in (root / "bank").glob(f"descriptors/*/{name}-s*.safetensors"):
        path.unlink()
    index = read_index(root)
    del index["members"][name]
    (root / "zoo.json").write_text(json.dumps(index))


def test_a_member_built_in_another_copy_of_the_zoo_merges_in_whole(zoo, tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    shutil.copytree(zoo, source)
    shutil.copytree(zoo, target)
    _without_member(target, "vit")
    stale = target / "bank" / "descriptors" / TINY.source_tasks[0] / "vit-s9.safetensors"
    stale.write_bytes(b"a seed the source zoo does not have")
    neighbour = target / "bank" / "descriptors" / TINY.source_tasks[0] / "vit-small-s0.safetensors"
    neighbour.write_bytes(b"another member's, whose name starts like vit's")
    result = run_ptc("zoo", "merge", source, "--member", "vit", "--root", target)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"zoo:vit <- {source}\n"
    assert neighbour.is_file() and not stale.exists()
    neighbour.unlink()
    # the index is written the way the build writes it
    assert tree_digest(target) == tree_digest(source)


def test_merging_from_another_world_or_an_unbuilt_member_changes_nothing(zoo, tmp_path):
    source, target = tmp_path / "source", tmp_path / "target"
    shutil.copytree(zoo, source)
    shutil.copytree(zoo, target)
    _without_member(source, "vit")
    before = tree_digest(target)
    result = run_ptc("zoo", "merge", source, "--member", "vit", "--root", target)
    assert result.returncode == 2
    assert (
        result.stderr
        == f"ptc: error: {source}: member 'vit' is not built there (hint: built members: clip)\n"
    )
    index = read_index(source)
    index["seed"] = 7
    (source / "zoo.json").write_text(json.dumps(index))
    result = run_ptc("zoo", "merge", source, "--member", "clip", "--root", target)
    assert result.returncode == 2
    assert result.stderr == (
        f"ptc: error: {source / 'zoo.json'}: seed is 7, this zoo's is 0 "
        "(hint: merge only from a copy of this zoo built with the same profile)\n"
    )
    assert tree_digest(target) == before
    for args in (
        ("zoo", "merge", tmp_path / "nowhere", "--member", "clip", "--root", target),
        ("zoo", "show", "--root", tmp_path / "nowhere"),
    ):
        result = run_ptc(*args)
        assert result.returncode == 2
        assert result.stderr == (
            f"ptc: error: no zoo at {tmp_path / 'nowhere'} (looked for "
            f"{tmp_path / 'nowhere' / 'zoo.json'}) (hint: build one with `ptc zoo build`)\n"
        )


def test_a_zoo_built_with_another_profile_is_refused(zoo):
    with pytest.raises(Exception, match="built with profile 'tiny', not 'full'"):
        build_zoo(zoo, profile_named("full"), echo=lambda _: None)


def test_a_profile_whose_world_changed_is_refused_not_recorded_over_the_old_world(zoo, tmp_path):
    import dataclasses

    from ptc.errors import InputError

    copy = tmp_path / "zoo"
    shutil.copytree(zoo, copy)
    before = tree_digest(copy)
    more_probes = dataclasses.replace(
        TINY, world=dataclasses.replace(TINY.world, probes=TINY.world.probes + 8)
    )
    with pytest.raises(
        InputError,
        match=rf"zoo.json: this zoo's world is .*'probes': {TINY.world.probes}.*; the tiny "
        rf"profile now says .*'probes': {TINY.world.probes + 8}",
    ):
        build_zoo(copy, more_probes, echo=lambda _: None)
    with pytest.raises(InputError, match="this zoo's seed is 0; the tiny profile now says 1"):
        build_zoo(copy, dataclasses.replace(TINY, seed=1), echo=lambda _: None)
    spread = dataclasses.replace(
        TINY, world=dataclasses.replace(TINY.world, pretrain_style="spread")
    )
    with pytest.raises(
        InputError,
        match=r"this zoo's world is .*'pretrain_style': 'plain'.*; the tiny profile now "
        r"says .*'pretrain_style': 'spread'",
    ):
        build_zoo(copy, spread, echo=lambda _: None)
    assert tree_digest(copy) == before


def test_a_zoo_written_before_its_world_fields_reads_as_the_defaults_they_now_have(zoo, tmp_path):
    """zoo.json files from before the fields (the committed zoos') still match their profile."""
    copy = tmp_path / "zoo"
    shutil.copytree(zoo, copy)
    index = json.loads((copy / "zoo.json").read_text())
    del (
        index["world"]["pretrain_style"],
        index["world"]["downstream_shift"],
        index["world"]["train_extra"],
    )
    (copy / "zoo.json").write_text(json.dumps(index))
    world = read_index(copy)["world"]
    assert (world["pretrain_style"], world["downstream_shift"], world["train_extra"]) == (
        "plain",
        "shared",
        0,
    )
    before = tree_digest(copy / "models")
    build_zoo(copy, TINY, echo=lambda _: None)  # nothing to do, and no refusal
    assert tree_digest(copy / "models") == before


def test_the_bank_moves_with_its_probes(zoo, tmp_path):
    moved = tmp_path / "elsewhere"
    shutil.copytree(zoo, moved)
    task = Bank(moved / "bank").task(TINY.tasks[0])
    assert all(str(p).startswith(str(moved)) and p.is_file() for p in task.probes)
    assert task.grid_hash == Bank(zoo / "bank").task(TINY.tasks[0]).grid_hash


def test_cached_edit_accuracy_is_what_the_folded_model_scores(zoo):
    """The harness reads accuracy after an edit from cached embeddings; an independent check
    folds the same operator into the model and scores the test split through it."""
    harness = paper.Zoo(zoo)
    target, source = harness.members[0], harness.members[1]
    view = harness.view(target)
    for task in harness.source_tasks:
        # strong enough to move predictions
        edit = view.operator(task, harness.descriptor(task, source, 0), 3.0)
        folded = view.encoder.with_edit(edit.float())
        # ptc eval's accuracy is a float32 mean; one image of the split moves it by ~1e-2.
        assert paper._accuracy_of(harness, folded, task) == pytest.approx(
            view.accuracy(task, edit), abs=1e-6
        )
        assert view.accuracy(task, torch.zeros_like(edit)) == view.accuracy(task)


def test_paper_results_carry_the_issue_keys(zoo, results):
    for dotted in (
        "addition.retention",
        "addition.cross_model_gain",
        "addition.oracle_gain",
        "addition.random_utd_gain",
        "addition.control_delta",
        "negation.lambda_1.removed_delta",
        "negation.lambda_1.control_delta",
        "agreement.same_task_cosine",
        "agreement.different_task_cosine",
        "linearity.max_rel_diff_fp64",
        "beyond.consensus.retention",
        "beyond.single_source.retention",
        "beyond.relative.retention",
        "certify.certified_fraction",
    ):
        node = results
        for part in dotted.split("."):
            node = node[part]
        assert isinstance(node, float), dotted
    assert len(results["seeds"]) == len(TINY.seeds) >= 2
    assert results["linearity"]["max_rel_diff_fp64"] <= 1e-12
    assert results["negation"]["lambda_0"]["removed_delta"] == 0.0
    assert {"same_task_cosine_centred", "different_task_cosine_centred"} <= set(
        results["agreement"]
    )
    # Per task, over member pairs (a two-member zoo has one pair): read from the bank independently.
    from ptc.compiler.method.descriptor import centred, cosine

    harness, by_task = paper.Zoo(zoo), results["agreement"]["same_task_cosine_centred_by_task"]
    harness.use_ridge(results["ridge"])
    first, second = harness.members
    for task in TINY.source_tasks:
        expected = cosine(
            centred(harness.descriptor(task, first, TINY.seeds[0])),
            centred(harness.descriptor(task, second, TINY.seeds[0])),
        )
        assert (
            by_task[task]["min"] == pytest.approx(expected) == by_task[task]["max"]
            and by_task[task]["n"] == 1
        )
    # Negation per task at lambda 1, recomputed for one task from the bank (first seed): with two
    # members each target has one cross-model cell.
    at_one = results["negation"]["lambda_1"]
    assert set(at_one["per_task"]) == set(TINY.source_tasks)
    assert sum(r["removed_delta"] for r in at_one["per_task"].values()) / len(
        TINY.source_tasks
    ) == pytest.approx(at_one["removed_delta"])
    task, removed, zero_shot = TINY.source_tasks[0], [], []
    for target, source in ((first, second), (second, first)):
        view = harness.view(target)
        edit = view.operator(task, harness.descriptor(task, source, TINY.seeds[0]), -1.0)
        removed.append(100 * (view.accuracy(task, edit) - view.accuracy(task)))
        zero_shot.append(100 * view.accuracy(task))
    assert at_one["per_task"][task]["removed_delta"] == pytest.approx(sum(removed) / 2)
    assert at_one["per_task"][task]["zero_shot"] == pytest.approx(sum(zero_shot) / 2)
    per_task_line = next(
        line for line in report.findings(results) if "negation at lambda 1, per task" in line
    )
    assert f"{task} {-at_one['per_task'][task]['removed_delta']:.1f} of " in per_task_line
    # With two members the consensus of "all other members" is the one other source: the same
    # gains. (Compared as gains: a tiny zoo's retention is NaN where its Oracle gains nothing.)
    beyond = results["beyond"]
    for seed in beyond["per_seed"]:
        for kind in ("difference", "relative"):
            assert seed[kind]["consensus_gain"] == pytest.approx(
                seed[kind]["single_gain"], abs=1e-9
            )
    assert (
        isinstance(results["certify"]["certified_changed"], int)
        and results["certify"]["certified_changed"] == 0
    )
    assert set(beyond["auto_strength"]) == {str(j) for j in range(1, len(TINY.source_tasks) + 1)}
    for row in beyond["auto_strength"].values():
        assert set(row) == {"fixed", "per_task", "auto"} and row["fixed"]["mean_weight"] == 0.5
    assert results["addition"]["cells"] == len(TINY.members) * (len(TINY.members) - 1) * len(
        TINY.source_tasks
    ) * len(TINY.seeds)


def test_headline_figures_carry_95_percent_intervals_from_resampling_the_test_images(zoo, results):
    for dotted in (
        "addition.oracle_gain",
        "addition.cross_model_gain",
        "addition.random_utd_gain",
        "addition.composition.gain_a",
        "negation.lambda_1.removed_delta",
        "negation.lambda_1.control_delta",
        "agreement.same_task_cosine",
        "beyond.auto_strength.1.auto.composed_gain",
        "seeds.0.oracle_gain",
    ):
        *path, key = dotted.split(".")
        node = results
        for part in path:
            node = node[int(part)] if isinstance(node, list) else node[part]
        low, high = node[f"{key}_ci95"]
        assert low <= node[key] <= high, dotted
    # Every scored split holds the committed test images and the regenerated extra ones.
    images = results["test_images"]
    assert (
        (images["per_class"], images["extra_per_class"])
        == (TINY.world.test, TINY.world.test_extra)
        == (16, 4)
    )
    bank = Bank(zoo / "bank")
    for task, count in images["per_task"].items():
        assert count == 20 * len(bank.task(task).classes)
    # Recomputed: negation at lambda 1, first seed, with the same resamples (each task's own,
    # shared by every target, as the images are).
    harness = paper.Zoo(zoo, resamples=images["resamples"])
    harness.use_ridge(results["ridge"])
    removed = []
    for target, source in (
        (TINY.members[0].name, TINY.members[1].name),
        (TINY.members[1].name, TINY.members[0].name),
    ):
        view = harness.view(target)
        for task in TINY.source_tasks:
            edit = view.operator(task, harness.descriptor(task, source, TINY.seeds[0]), -1.0)
            removed.append(100 * (view.accuracy(task, edit) - view.accuracy(task)))
    mean = sum(removed) / len(removed)
    assert float(mean) == pytest.approx(results["negation"]["lambda_1"]["removed_delta"])
    assert mean.interval() == pytest.approx(results["negation"]["lambda_1"]["removed_delta_ci95"])


def test_composed_retention_is_the_papers_protocol_recomputed_from_the_bank(zoo, results):
    """Table 1's two-task cells: each task's term from the other member at alpha 0.5, against the
    target's own two terms (the Oracle), recomputed here from the bank for every seed."""
    harness = paper.Zoo(zoo)
    harness.use_ridge(results["ridge"])
    task_a, task_b = TINY.source_tasks  # one pair; with two members one source per term
    cross, oracle = {"a": [], "b": []}, {"a": [], "b": []}
    for seed in TINY.seeds:
        for target, other in (
            (TINY.members[0].name, TINY.members[1].name),
            (TINY.members[1].name, TINY.members[0].name),
        ):
            view = harness.view(target)
            for gains, source in ((cross, other), (oracle, target)):
                edit = view.operator(
                    task_a, harness.descriptor(task_a, source, seed), 0.5
                ) + view.operator(task_b, harness.descriptor(task_b, source, seed), 0.5)
                for position, task in (("a", task_a), ("b", task_b)):
                    gains[position].append(100 * (view.accuracy(task, edit) - view.accuracy(task)))
    composition = results["addition"]["composition"]
    assert composition["cells"] == len(cross["a"]) == 2 * len(TINY.seeds)
    for position in "ab":
        assert composition[f"gain_{position}"] == pytest.approx(
            sum(cross[position]) / len(cross[position])
        )
        assert composition[f"oracle_gain_{position}"] == pytest.approx(
            sum(oracle[position]) / len(oracle[position])
        )
    pooled = sum(cross["a"] + cross["b"]) / sum(oracle["a"] + oracle["b"])
    assert composition["retention"] == pytest.approx(pooled, nan_ok=True)
    by_task = composition["per_task"][task_b]
    assert by_task["oracle_gain"] == pytest.approx(sum(oracle["b"]) / len(oracle["b"]))
    assert by_task["cells"] == len(cross["b"])
    text = report.markdown(results, "paper-tiny")
    low, high = composition["oracle_gain_a_ci95"]
    assert (
        f"| Oracle | {report._f(composition['oracle_gain_a'])} [{report._f(low)}, {report._f(high)}] | "
        f"{report._f(composition['oracle_gain_b'])} ["
    ) in text
    assert "| Paper's retention | 0.80 | 0.74 | |" in text
    assert any(
        "two-task composed cells, the paper's protocol" in line for line in report.findings(results)
    )


def test_addition_against_strength_recomputed_at_full_strength(zoo, results):
    """Table 12 at alpha 1, first seed: the composition, A's term alone (and what it does to B),
    and the Oracle's composition, recomputed from the bank."""
    harness = paper.Zoo(zoo)
    harness.use_ridge(results["ridge"])
    (task_a, task_b), seed = TINY.source_tasks, TINY.seeds[0]
    ours, alone, oracle = [], [], []
    for target, other in (
        (TINY.members[0].name, TINY.members[1].name),
        (TINY.members[1].name, TINY.members[0].name),
    ):
        view = harness.view(target)
        term = lambda task, source: view.operator(task, harness.descriptor(task, source, seed), 1.0)  # noqa: E731
        points = lambda task, edit: 100 * (view.accuracy(task, edit) - view.accuracy(task))  # noqa: E731
        ours.append(points(task_a, term(task_a, other) + term(task_b, other)))
        alone.append(points(task_b, term(task_a, other)))
        oracle.append(points(task_a, term(task_a, target) + term(task_b, target)))
    at_one = results["strength"]["1"]
    assert set(results["strength"]) == {"0.25", "0.5", "0.75", "1"} and at_one["cells"] == 2
    assert at_one["ours"]["gain_a"] == pytest.approx(sum(ours) / 2)
    assert at_one["single_a"]["gain_b"] == pytest.approx(sum(alone) / 2)
    assert at_one["oracle"]["gain_a"] == pytest.approx(sum(oracle) / 2)
    text = report.markdown(results, "paper-tiny")
    assert "| 1 | Single-A (A's term alone) |" in text and "+21.79 | -4.39 | -3.64 |" in text


def test_where_the_residual_reaches_the_edit_recomputed_for_one_cell(zoo, results):
    """Table 8 for zoo:clip as the target of zoo:vit's first task: its operator acts on the
    embedding itself, so the shift field is the probes' embeddings times the edit."""
    from ptc.compiler.method.descriptor import cosine

    harness = paper.Zoo(zoo)
    harness.use_ridge(results["ridge"])
    task, seed = TINY.source_tasks[0], TINY.seeds[0]
    view = harness.view("clip")
    assert view.grids[task].regressors is None
    own, theirs = harness.descriptor(task, "clip", seed), harness.descriptor(task, "vit", seed)
    own_edit, edit = view.operator(task, own, 0.5), view.operator(task, theirs, 0.5)
    z = view.grids[task].inputs.double()
    row = next(r for r in results["residual"]["rows"] if (r["target"], r["task"]) == ("clip", task))
    assert row["source"] == "vit"
    assert row["descriptor"] == pytest.approx(cosine(theirs, own))
    assert row["operator"] == pytest.approx(cosine(edit, own_edit))
    assert row["shift_field"] == pytest.approx(cosine(z @ edit.T, z @ own_edit.T))
    assert row["amplification"] == pytest.approx(
        float(((edit - own_edit).norm() / own_edit.norm()) / ((theirs - own).norm() / own.norm()))
    )
    assert "### Where the cross-model residual reaches the edit (Table 8" in report.markdown(
        results, "paper-tiny"
    )


def test_table_8_columns_on_known_cells():
    """Two (target, task) pairs of three sources each, with gains and agreements set by hand."""
    from ptc.lab.zoo import residual

    def row(target, source, agreement, gain, oracle=10.0):
        return {
            "target": target,
            "task": "t",
            "source": source,
            "descriptor": agreement,
            "operator": -agreement,
            "shift_field": agreement,
            "amplification": agreement,
            "gain": gain,
            "oracle_gain": oracle,
        }

    rows = [
        row("x", "a", 0.9, 9.0),
        row("x", "b", 0.5, 5.0),
        row("x", "c", 0.1, 1.0),
        row("y", "a", 0.6, 8.0),
        row("y", "b", 0.8, 2.0),
        row("y", "c", 0.2, 4.0, oracle=2.0),
    ]
    table = residual.summarise(rows)
    assert table["scored_cells"] == 5  # y/c's Oracle gains under 3 points
    # Best source: x's most agreeing source (a) transfers most; y's (b) does not, nor its least (c).
    assert (table["descriptor"]["best_source_hits"], table["descriptor"]["pairs"]) == (1, 2)
    # reversed: c agrees most at x, c at y: both misses
    assert table["operator"]["best_source_hits"] == 0
    # Forfeited shares 0.1, 0.5, 0.9, 0.2, 0.8 against agreements 0.9, 0.5, 0.1, 0.6, 0.8: ranks
    # (1, 3, 5, 2, 4) against (5, 2, 1, 3, 4), so rho = 1 - 6 * (16 + 1 + 16 + 1 + 0) / (5 * 24) = -0.7.
    assert table["descriptor"]["rank_correlation"] == pytest.approx(-0.7)
    assert table["operator"]["rank_correlation"] == pytest.approx(0.7)
    assert table["amplification"] == pytest.approx(0.55)  # median of the six
    assert table["descriptor"]["agreement"] == pytest.approx(3.1 / 6)


def test_the_diagnosis_puts_table_8_beside_the_paper_and_the_step_to_full_strength():
    from ptc.lab.zoo import residual

    place = {"agreement": 0.5, "rank_correlation": -0.3, "best_source_hits": 1, "pairs": 2}
    table8 = {
        "descriptor": place,
        "operator": {**place, "agreement": 0.25},
        "shift_field": place,
        "amplification": 1.2,
    }
    gains = lambda a, b: {"gain_a": a, "gain_b": b, "control_delta": 0.0}  # noqa: E731
    sweep = {
        "0.5": {"ours": gains(8, 8), "oracle": gains(12, 12), "retention": 0.67},
        "1": {"ours": gains(9, 7.5), "oracle": gains(16, 15), "retention": 0.5},
    }
    line = report._where_retention_goes(
        table8, sweep, {"residual": residual.PAPER, "strength": paper.PAPER["strength"]}
    )
    assert line.startswith(
        "diagnosis: cross-model cells agree with the target's own descriptor at 0.50 / 0.25 / 0.50 "
        "(descriptors / operators / shift fields; paper 0.59 / 0.39 / 0.43), and the solve "
        "amplifies the residual by 1.20 (paper 1.5)"
    )
    assert (
        "composed transfer moves +1.00 / -0.50 points on tasks A / B (paper +0.33 / -1.18) and the Oracle's "
        "composition +4.00 / +3.00; composed retention by strength 0.5: 0.67, 1: 0.50"
    ) in line


def test_a_report_written_before_the_composed_oracle_still_renders(results):
    """Committed trial reports carry only the composed cross-model gains: their markdown is
    rendered again from JSON, so the report must read them as they are."""
    old = json.loads(json.dumps(results))
    old["addition"]["composition"] = {
        key: old["addition"]["composition"][key]
        for key in ("gain_a", "gain_b", "control_delta", "cells")
    }
    for row in old["seeds"]:
        del row["composed_retention"]
    del old["seed_spread"]["composed_retention"]
    for key in ("strength", "residual"):
        del old[key], old["paper"][key]
    text = report.markdown(old, "old")
    assert (
        f"Two-task composition (Table 1), {old['addition']['composition']['cells']} cells: task A"
        in text
    )
    assert "Composed retention over seeds" not in text
    assert not any("composed cells, the paper's protocol" in line for line in report.findings(old))
    assert "Table 12" not in text and "Table 8" not in text


def test_ptc_paper_writes_json_markdown_and_plots(zoo, tmp_path):
    out = tmp_path / "results"
    result = run_ptc("paper", "--profile", "tiny", "--root", zoo, "--out", out)
    assert result.returncode == 0, result.stderr
    written = sorted(p.name for p in out.iterdir())
    assert written == [
        "paper-tiny-negation.png",
        "paper-tiny-scaling.png",
        "paper-tiny.json",
        "paper-tiny.md",
    ]
    saved = json.loads((out / "paper-tiny.json").read_text())
    assert saved["findings"] == report.findings(saved)
    assert "## Negation" in (out / "paper-tiny.md").read_text()
    assert (out / "paper-tiny-negation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "fp64 linearity" in result.stdout


def test_ptc_paper_on_the_train_split_scores_train_and_says_so(zoo, tmp_path):
    out = tmp_path / "results"
    result = run_ptc("paper", "--profile", "tiny", "--root", zoo, "--out", out, "--split", "train")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in out.iterdir()) == [
        "paper-tiny-train-negation.png",
        "paper-tiny-train-scaling.png",
        "paper-tiny-train.json",
        "paper-tiny-train.md",
    ]
    saved = json.loads((out / "paper-tiny-train.json").read_text())
    assert saved["split"] == "train" and saved["findings"][0] == report.TRAIN_BANNER
    text = (out / "paper-tiny-train.md").read_text()
    assert (
        f"**This report is {report.TRAIN_BANNER}.**" in text
        and "(paper-tiny-train-negation.png)" in text
    )
    # Each cell's zero-shot is the target's accuracy on the train split, read independently.
    train = paper.Zoo(zoo, split="train")
    for cell in saved["cells"][:3]:
        record = train.bank.task(cell["task"])
        expected = zero_shot_accuracy(
            train.encoder(cell["target"]),
            record,
            zoo / "world" / "tasks" / cell["task"] / "train",
            progress=False,
        )["accuracy"]
        assert cell["zero_shot"] == pytest.approx(100 * expected, abs=1e-4)
    # The ridge choice saw the same Random-UTD draws as the report: at the chosen ridge its train
    # figure is the report's, pooled over the cells it chose on (targets that tell the classes apart).
    quality = read_index(zoo)["members"]
    chosen = [
        c for c in saved["cells"] if quality[c["target"]]["quality"][c["task"]]["distinct"]
    ] or saved["cells"]
    selection = saved["ridge_selection"]
    assert selection["train_random_utd_gain"][str(saved["ridge"])] == pytest.approx(
        sum(c["random_utd_gain"] for c in chosen) / len(chosen)
    )
    assert "Random-UTD is within +-1 point" in text
    with pytest.raises(ValueError, match="unknown split"):
        paper.run(zoo, echo=lambda _: None, split="probes")


def test_the_ridge_is_the_best_oracle_among_those_that_keep_random_utd_within_its_bar(monkeypatch):
    from types import SimpleNamespace

    # Oracle gain grows as the ridge shrinks; a structureless descriptor does harm from 1e-4 on.
    oracle = {1.0: 1.0, 0.1: 4.0, 0.01: 6.0, 1e-3: 7.0, 1e-4: 8.0, 1e-5: 7.5}
    harm = {1.0: 0.0, 0.1: -0.2, 0.01: -0.5, 1e-3: -0.9, 1e-4: -1.6, 1e-5: -2.0}

    def cells(zoo, seed, ridge):
        yield {
            "target": "a",
            "task": "t",
            "oracle_gain": oracle[ridge],
            "random_utd_gain": harm[ridge],
        }

    monkeypatch.setattr(paper, "own_descriptor_cells", cells)
    zoo = SimpleNamespace(
        split_name="train",
        members=["a"],
        source_tasks=["t"],
        seeds=[0],
        index={"members": {"a": {"quality": {"t": {"distinct": True}}}}},
    )
    chosen = paper.choose_ridge(zoo)
    assert chosen["ridge"] == 1e-3
    # a margin of 0.1: not close
    assert report.ridge_choice(chosen).startswith(
        "the largest Oracle gain among ridges whose Random-UTD is within +-1 point (Oracle"
    )
    harm[1e-3] = -0.99  # the full zoo's own margin on train: said so, with the figure
    assert report.ridge_choice(paper.choose_ridge(zoo)).startswith(
        "the largest Oracle gain among ridges whose Random-UTD is within +-1 point, by a margin of 0.01 point: on "
        "another sample"
    )
    # no candidate within the bar: the largest Oracle gain, said so
    harm.update({r: -3.0 for r in harm})
    chosen = paper.choose_ridge(zoo)
    assert chosen["ridge"] == 1e-4
    assert report.ridge_choice(chosen).startswith(
        "the largest Oracle gain, since no ridge kept Random-UTD within"
    )
    with pytest.raises(ValueError, match="never on test"):
        paper.choose_ridge(SimpleNamespace(**(vars(zoo) | {"split_name": "test"})))


def _zoo_recipe(zoo, folder, evaluate):
    import yaml

    index = read_index(zoo)
    target, source = list(index["members"])[:2]
    task, control = TINY.source_tasks[0], TINY.control_tasks[0]
    recipe = {
        "target": f"zoo:{target}",
        "bank": str(zoo / "bank"),
        "terms": [{"task": task, "source": f"{source}-s0", "weight": 0.5}],
        "evaluate": evaluate(zoo, task, control),
        "export": {"out": "dist", "formats": ["safetensors"]},
    }
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path, task, control


def test_a_recipe_prints_held_out_accuracy_before_and_after_its_edit(zoo, tmp_path):
    def tests(z, task, control):
        return {t: str(z / "world" / "tasks" / t / "test") for t in (task, control)}

    recipe, task, control = _zoo_recipe(zoo, tmp_path, tests)
    result = run_ptc("build", recipe, env={"PTC_ZOO": str(zoo)})
    assert result.returncode == 0, result.stderr
    report_json = json.loads((tmp_path / "dist" / "report.json").read_text())
    assert (
        report_json["evaluation"][task]["role"] == "term"
        and report_json["evaluation"][control]["role"] == "held out"
    )
    for name in (task, control):  # the printed "after" is what the shipped checkpoint scores
        evaluated = run_ptc(
            "eval",
            tmp_path / "dist",
            "--task",
            name,
            "--data",
            zoo / "world" / "tasks" / name / "test",
            "--bank",
            zoo / "bank",
            "--json",
            env={"PTC_ZOO": str(zoo)},
        )
        assert evaluated.returncode == 0, evaluated.stderr
        assert json.loads(evaluated.stdout)["accuracy"] == pytest.approx(
            report_json["evaluation"][name]["after"], abs=1e-9
        )
        assert f"held-out zero-shot {name}" in result.stdout


def test_a_recipe_evaluating_an_unknown_task_or_folder_fails_in_one_line(zoo, tmp_path):
    unknown = lambda z, task, control: {"nope": str(z)}  # noqa: E731
    recipe, _, _ = _zoo_recipe(zoo, tmp_path, unknown)
    result = run_ptc("check", recipe, env={"PTC_ZOO": str(zoo)})
    assert (
        result.returncode == 2 and "evaluate.nope: task 'nope' is not registered" in result.stderr
    )
    missing = lambda z, task, control: {control: "no/such/folder"}  # noqa: E731
    recipe, _, control = _zoo_recipe(zoo, tmp_path, missing)
    result = run_ptc("check", recipe, env={"PTC_ZOO": str(zoo)})
    assert (
        result.returncode == 2
        and f"evaluate.{control}:" in result.stderr
        and "is not a folder" in result.stderr
    )
    assert len(result.stderr.strip().splitlines()) == 1


def test_centred_agreement_ignores_a_shift_shared_by_a_probes_classes():
    generator = torch.Generator().manual_seed(0)
    u = torch.randn(30, 5, generator=generator, dtype=torch.float64)
    shifted = u + torch.randn(30, 1, generator=generator, dtype=torch.float64) * 10
    from ptc.compiler.method.descriptor import centred, cosine

    assert cosine(shifted, u) < 0.5
    assert cosine(centred(shifted), centred(u)) == pytest.approx(1.0, abs=1e-12)


def test_the_report_names_the_member_whose_descriptors_transfer_worst():
    def cell(source, target, cross, oracle):
        return {
            "source": source,
            "target": target,  # noqa: E731
            "cross_model_gain": cross,
            "oracle_gain": oracle,
        }

    cells = [
        cell("a-1", "b", 4.0, 8.0),
        cell("a-1", "b", 2.0, 4.0),
        cell("a-1", "c", 3.0, 6.0),
        cell("b", "a-1", -6.0, 6.0),
        cell("b", "c", 0.0, 6.0),
        cell("c", "a-1", 3.0, 6.0),
    ]
    pairs = {(r["source"], r["target"]): r for r in paper.per_pair(cells)}
    assert (pairs["a-1", "b"]["cross_model_gain"], pairs["a-1", "b"]["oracle_gain"]) == (3.0, 6.0)
    assert pairs["a-1", "b"]["retention"] == pytest.approx(0.5) and pairs["a-1", "b"]["cells"] == 2
    worst = paper.worst_source(cells)
    # b as a source: -6 / 12 = -0.5; without it: (4 + 2 + 3 + 3) / (8 + 4 + 6 + 6) = 0.5.
    assert worst["member"] == "b" and worst["retention"] == pytest.approx(-0.5)
    assert worst["others_retention"] == pytest.approx(0.5)
    line = report._worst_source({"worst_source": worst})
    assert line.startswith(
        "diagnosis: b's descriptors transfer worst (retention -0.500 as a source); "
        "the other members' retain 0.500 without it"
    )
    assert paper.worst_source(cells[:3]) is None  # one source member: nothing to single out


def test_the_oracles_headroom_is_read_on_the_train_split_and_agrees_with_ptc_eval(zoo, results):
    from ptc.compiler.embed import embed_probe_files
    from ptc.compiler.method.descriptor import class_embeddings, normalise
    from ptc.compiler.tasks.labelled import labelled_files
    from ptc.lab.zoo import headroom

    room = results["headroom"]
    assert room["split"] == "train" and room["ridge"] == results["ridge"]
    assert len(room["cells"]) == len(TINY.members) * len(TINY.source_tasks)
    harness = paper.Zoo(zoo, split="train")
    for cell in room[
        "cells"
    ]:  # every cell: the tiny sources move few predictions, and not in each cell
        record, folder = harness.bank.task(cell["task"]), harness.test_dir(cell["task"])
        assert folder.name == "train"
        tuned = harness.encoder(cell["target"]).with_adapter(
            harness.adapter(cell["target"], cell["task"], room["seed"])
        )
        for key, encoder in (("finetuned", tuned), ("zero_shot", harness.encoder(cell["target"]))):
            assert cell[key] == pytest.approx(
                100 * zero_shot_accuracy(encoder, record, folder, progress=False)["accuracy"],
                abs=1e-4,
            )
        # The half step, from each encoder's own class prompts and embeddings of the split's files.
        pairs = labelled_files(folder, record.classes)
        labels = torch.tensor([label for _, label in pairs])

        def affinities(encoder):
            rows = class_embeddings(
                encoder.embed_prompts(record.prompts).double(), len(record.classes)
            )
            return (
                normalise(embed_probe_files(encoder, [p for p, _ in pairs], 16, "", False).double())
                @ rows.T
            )

        before, after = affinities(harness.encoder(cell["target"])), affinities(tuned)
        half = float(((before + 0.5 * (after - before)).argmax(dim=1) == labels).double().mean())
        assert cell["half_step"] == pytest.approx(100 * half, abs=1e-4)
    assert set(room["mean"]) == set(headroom.COLUMNS) and set(room["per_target"]) == {
        m.name for m in TINY.members
    }
    first = room["per_target"][room["cells"][0]["target"]]["zero_shot"]
    mine = [c["zero_shot"] for c in room["cells"] if c["target"] == room["cells"][0]["target"]]
    assert first == pytest.approx(sum(mine) / len(mine))
    with pytest.raises(ValueError, match="train split"):
        headroom.run(paper.Zoo(zoo), 0)
    assert "### Why the Oracle recovers little (train split" in report.markdown(results)
    assert any(
        line.startswith("diagnosis (train split): the Oracle is limited")
        for line in report.findings(results)
    )


def test_headroom_measures_separate_class_offsets_and_generalisation():
    from types import SimpleNamespace

    from ptc.lab.zoo import headroom

    generator = torch.Generator().manual_seed(0)
    n, d, m = 200, 12, 4
    offsets = torch.randn(1, m, generator=generator, dtype=torch.float64)
    row_shift = torch.randn(n, 1, generator=generator, dtype=torch.float64)
    assert headroom.class_bias_share(offsets.expand(n, m) + row_shift) == pytest.approx(1.0)
    noise = torch.randn(n, m, generator=generator, dtype=torch.float64)
    no_offsets = noise - noise.mean(dim=0, keepdim=True)
    assert headroom.class_bias_share(no_offsets + row_shift) == pytest.approx(0.0, abs=1e-12)
    # a probe's shared shift changes nothing
    assert headroom.explained(noise + row_shift, noise) == pytest.approx(1.0)
    assert headroom.explained(torch.zeros_like(noise), noise) == pytest.approx(0.0)

    # A descriptor that is a linear function of the normalised inputs generalises to held-out
    # probes; pure noise does not.
    inputs = torch.randn(n, d, generator=generator, dtype=torch.float64)
    rows = torch.nn.functional.normalize(
        torch.randn(m, d, generator=generator, dtype=torch.float64), dim=1
    )
    grid = SimpleNamespace(inputs=inputs, class_rows=rows, regressors=None)
    linear = (
        torch.nn.functional.normalize(inputs, dim=1)
        @ torch.randn(d, d, generator=generator, dtype=torch.float64)
        @ rows.T
    )
    assert headroom.held_out_explained(grid, linear, 1e-8) == pytest.approx(1.0, abs=1e-6)
    assert headroom.held_out_explained(grid, noise, 1e-8) < 0.1

    labels = torch.arange(n) % 2
    separable = torch.randn(n, d, generator=generator, dtype=torch.float64)
    separable[:, 0] = torch.where(labels == 1, 3.0, -3.0)
    assert headroom.linear_probe(separable, labels) == 1.0
    # one example of a class: no folds
    assert math.isnan(headroom.linear_probe(separable[:3], labels[:3]))


def test_the_bf16_measurement_runs_the_zoo_in_each_precision(zoo, tmp_path):
    """benchmarks/bf16_zoo.py: its fp32 side is `ptc paper`'s own addition (the same cells from
    the bank's descriptors), and its bf16 side really ran in bf16 and moved the numbers by bf16's
    rounding, not more."""
    import statistics

    from ptc.lab.benchmarks import bf16_zoo

    results = bf16_zoo.run(bf16_zoo.copy_of_zoo(zoo, tmp_path / "zoo"))
    assert max(d["fp32_vs_bank"] for d in results["descriptors"]) < 1e-5
    plain = paper.Zoo(zoo)
    plain.use_ridge(bf16_zoo.RIDGE)
    cells = paper.addition_cells(plain, plain.seeds[0])
    fp32 = results["addition"]["fp32"]
    assert fp32["cells"] == len(cells)
    assert fp32["cross_model_gain"] == pytest.approx(
        statistics.fmean(c["cross_model_gain"] for c in cells), abs=1e-9
    )
    assert 1e-4 < results["grid_relative_difference"]["median"] < 5e-2
    assert 1e-4 < results["descriptor_relative_difference"]["median"] < 1e-1
