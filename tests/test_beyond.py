"""What ptc adds to the paper: consensus and target-relative descriptors, label-free
strengths and the composition certificate, each checked against an independent computation
and through real builds on the tiny world."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from conftest import run_ptc, write_recipe
from ptc import targets
from ptc.compiler.bank.store import Bank
from ptc.compiler.edit.strength import choose_strengths
from ptc.compiler.embed import embed_grid
from ptc.compiler.export.onnx_embed import input_forward
from ptc.compiler.method.descriptor import (
    AGREEMENT_FLOOR,
    affinity,
    agreement_weights,
    consensus,
    relative_descriptor,
)
from ptc.compiler.method.ridge import solve_dense
from ptc.compiler.recipe.schema import Strength
from ptc.compiler.verify.certify import certificate

RIDGE = 0.01


# -- pure math ----------------------------------------------------------------------------------
def _descriptors(count=3, shape=(9, 4), seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.randn(shape, generator=generator, dtype=torch.float64) * (i + 1) for i in range(count)
    ]


def test_consensus_rules_match_their_definitions():
    us = _descriptors()
    arrays = np.stack([u.numpy() for u in us])
    assert np.allclose(consensus(us).numpy(), arrays.mean(axis=0))
    weights = np.array([1.0, 2.0, 5.0])
    assert np.allclose(
        consensus(us, list(weights)).numpy(), np.tensordot(weights / weights.sum(), arrays, 1)
    )
    norms = np.linalg.norm(arrays.reshape(3, -1), axis=1)
    expected = np.tensordot(weights / weights.sum() / norms, arrays, 1) * float(
        weights / weights.sum() @ norms
    )
    assert np.allclose(consensus(us, list(weights), "normalised").numpy(), expected)
    assert np.allclose(consensus(us, combine="median").numpy(), np.median(arrays, axis=0))
    assert np.allclose(consensus(us[:2], combine="median").numpy(), np.median(arrays[:2], axis=0))
    with pytest.raises(ValueError, match="median takes no weights"):
        consensus(us, [1, 1, 1], "median")


def test_a_zero_descriptor_lowers_a_normalised_consensus_without_making_it_nan():
    u = _descriptors(count=1)[0]
    zero = torch.zeros_like(u)
    # The zero source adds its norm (0) to the mean norm and no direction: half of u, as `mean` gives.
    assert torch.allclose(consensus([u, zero], combine="normalised"), u / 2)
    assert torch.allclose(consensus([u, zero], [3.0, 1.0], "normalised"), 0.75 * u)
    assert torch.equal(consensus([zero, zero], combine="normalised"), zero)


def _agreement_numpy(source, target):
    """Row-centred cosine of two affinity matrices, floored, written out in numpy."""
    a, b = source - source.mean(1, keepdims=True), target - target.mean(1, keepdims=True)
    return max(float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b))), AGREEMENT_FLOOR)


def test_agreement_weights_are_row_centred_cosines_with_the_target():
    target, close, unrelated = _descriptors(3, seed=2)
    close = 0.8 * target + 0.3 * close + 5.0  # a per-grid offset does not count, nor does scale
    # a per-probe offset does not count either
    opposite = -target + 2.0 * torch.ones_like(target)[:, :1]
    weights = agreement_weights([close, unrelated, opposite], target)
    expected = [_agreement_numpy(x.numpy(), target.numpy()) for x in (close, unrelated, opposite)]
    assert weights == pytest.approx(expected, abs=1e-12)
    assert weights[0] > 0.8 and weights[2] == AGREEMENT_FLOOR
    # A source whose class prompts collapsed has constant rows: no agreement, not NaN.
    collapsed = torch.ones_like(target) * 0.3
    assert agreement_weights([collapsed, close], target) == pytest.approx(
        [AGREEMENT_FLOOR, weights[0]], abs=1e-12
    )
    assert agreement_weights([close], torch.zeros_like(target)) == [AGREEMENT_FLOOR]
    with pytest.raises(ValueError, match="do not match"):
        agreement_weights([close[:3]], target)


def test_the_relative_descriptor_is_the_standardised_expert_minus_the_target():
    utd, source, target = _descriptors(3, seed=1)
    s, t = source.numpy(), target.numpy()
    finetuned = utd.numpy() + s
    expected = t.mean() + t.std(ddof=1) * (finetuned - s.mean()) / s.std(ddof=1) - t
    assert np.allclose(relative_descriptor(utd, source, target).numpy(), expected)
    # With the target as its own source it is the paper's descriptor ...
    assert torch.allclose(relative_descriptor(utd, source, source), utd)
    # ... and it does not depend on the source's affinity scale, only on its shape.
    assert torch.allclose(
        relative_descriptor(3 * utd, 3 * source + 0.7, target),
        relative_descriptor(utd, source, target),
    )


def test_the_certificate_is_the_margin_against_the_bound_and_is_sound():
    generator = torch.Generator().manual_seed(3)
    z = torch.randn(400, 8, generator=generator, dtype=torch.float64)
    rows = torch.nn.functional.normalize(
        torch.randn(5, 8, generator=generator, dtype=torch.float64), dim=1
    )
    own = 0.3 * torch.randn(8, 8, generator=generator, dtype=torch.float64)
    other = 0.2 * torch.randn(8, 8, generator=generator, dtype=torch.float64)
    figures = certificate(z, None, rows, own, own + other)
    # Independent: the same margin and bound written out per input.
    single = z + z @ own.T
    single /= single.norm(dim=1, keepdim=True)
    composed = z + z @ (own + other).T
    composed /= composed.norm(dim=1, keepdim=True)
    certified = changed = both = 0
    for f1, f in zip(single, composed):
        scores = (rows @ f1).tolist()
        top = max(range(5), key=scores.__getitem__)
        margin = scores[top] - max(s for j, s in enumerate(scores) if j != top)
        bound = max(float((rows[top] - rows[j]).norm()) for j in range(5)) * float((f - f1).norm())
        moved = int((rows @ f).argmax()) != top
        certified += margin > bound + 1e-9
        changed += moved
        both += moved and margin > bound + 1e-9
    assert (figures["certified"], figures["changed"], figures["certified_changed"]) == (
        certified,
        changed,
        both,
    )
    # the case is neither trivial nor vacuous
    assert both == 0 and 0 < certified < 400 and changed > 0
    # No other term: every prediction with a positive margin is certified and none changes.
    alone = certificate(z, None, rows, own, own)
    assert alone["certified"] == 400 and alone["changed"] == 0


# -- on the tiny world ----------------------------------------------------------------------------
@pytest.fixture()
def two_sources(world, bank_copy):
    """The session bank with a second colour descriptor, 'other': the source's, reshaped and
    rescaled, as another model's would be (a consensus only needs two entries of one grid)."""
    bank = Bank(bank_copy)
    src = bank.descriptor("colour", "src")
    utd = src.tensors["utd"]
    other = 0.6 * utd + 0.02 * torch.flip(utd, dims=[0])
    bank.put_descriptor(
        "colour",
        "other",
        {"utd": other, "source_affinity": src.tensors["source_affinity"] * 1.3},
        {**src.meta, "id": "other"},
    )
    return bank


def _target_grid(world, bank, task):
    """The target's grid as a build that writes ONNX embeds it: on onnxruntime (the same cached
    entry the build reads)."""
    target = targets.load(f"hf:{world.target}")
    runtime = ("onnxruntime", input_forward(target, bank))
    return target, embed_grid(target, bank.task(task), bank, progress=False, runtime=runtime)


def _built_edits(out):
    from safetensors import safe_open

    with safe_open(str(out / "terms.safetensors"), "pt") as handle:
        record = json.loads(handle.metadata()["ptc"])
        return record, [handle.get_tensor(f"term_{i}") for i in range(len(record["terms"]))]


def test_a_consensus_term_solves_the_weighted_mean_of_its_sources(world, two_sources, tmp_path):
    terms = [
        {
            "task": "colour",
            "source": ["src", "other"],
            "source_weights": [3, 1],
            "combine": "mean",
            "weight": 0.5,
        }
    ]
    recipe = write_recipe(
        tmp_path / "r.yaml", world, terms, bank=str(two_sources.root), solve={"ridge": RIDGE}
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    term = report["terms"][0]
    assert (
        term["source"] == "src+other"
        and term["sources"] == ["src", "other"]
        and term["combine"] == "mean"
    )
    assert term["source_descriptor_sha256"] == [
        two_sources.descriptor("colour", i).sha256 for i in ("src", "other")
    ]
    _, grid = _target_grid(world, two_sources, "colour")
    mean = (
        0.75 * two_sources.descriptor("colour", "src").tensors["utd"].double()
        + 0.25 * two_sources.descriptor("colour", "other").tensors["utd"].double()
    )
    expected = 0.5 * solve_dense(grid.inputs, grid.class_rows, mean, RIDGE)
    _, edits = _built_edits(tmp_path / "out")
    assert torch.allclose(edits[0], expected, atol=1e-6, rtol=1e-5)


def test_a_consensus_term_weighs_its_sources_by_agreement_with_the_target_by_default(
    world, two_sources, tmp_path
):
    # "near" read the probes as the target does (its affinities are the target's own); "far"
    # reads them in another order: it should weigh less. (Two untrained tiny models agree on
    # nothing, so the fixture's own sources would both sit at the floor.)
    src = two_sources.descriptor("colour", "src")
    _, grid = _target_grid(world, two_sources, "colour")
    t = affinity(grid.inputs.double(), grid.class_rows.double()).numpy()
    near_affinity = torch.from_numpy(t).float()
    for name, source_affinity, sign in (
        ("near", near_affinity, 1),
        ("far", torch.roll(near_affinity, 7, dims=0), -1),
    ):
        two_sources.put_descriptor(
            "colour",
            name,
            {"utd": sign * src.tensors["utd"], "source_affinity": source_affinity},
            {**src.meta, "id": name},
        )
    terms = [{"task": "colour", "source": ["near", "far"], "weight": 0.5}]
    recipe = write_recipe(
        tmp_path / "r.yaml", world, terms, bank=str(two_sources.root), solve={"ridge": RIDGE}
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    entries = [two_sources.descriptor("colour", i) for i in ("near", "far")]
    weights = [_agreement_numpy(e.tensors["source_affinity"].double().numpy(), t) for e in entries]
    term = json.loads((tmp_path / "out" / "report.json").read_text())["terms"][0]
    assert term["weighting"] == "agreement" and term["source_weights"] == pytest.approx(
        weights, rel=1e-9
    )
    assert weights[0] > weights[1]
    # The normalised rule with those weights, written out.
    us = [e.tensors["utd"].double().numpy() for e in entries]
    c = np.array(weights) / sum(weights)
    norms = np.array([np.linalg.norm(u) for u in us])
    expected_u = sum(ci / ni * u for ci, ni, u in zip(c, norms, us)) * float(c @ norms)
    expected = 0.5 * solve_dense(grid.inputs, grid.class_rows, torch.from_numpy(expected_u), RIDGE)
    _, edits = _built_edits(tmp_path / "out")
    assert torch.allclose(edits[0], expected, atol=1e-6, rtol=1e-5)
    # `source_weights: uniform` asks for the unweighted rule (checked without a second build).
    terms[0]["source_weights"] = "uniform"
    result = run_ptc(
        "check",
        write_recipe(
            tmp_path / "u.yaml", world, terms, bank=str(two_sources.root), export={"out": "uniform"}
        ),
    )
    assert result.returncode == 0 and "normalised of 2, uniform weights" in result.stdout, (
        result.stderr
    )


def test_agreement_weighting_on_descriptors_without_source_affinities_is_refused(
    world, bank_copy, tmp_path
):
    bank = Bank(bank_copy)
    src = bank.descriptor("colour", "src")
    bank.put_descriptor("colour", "old", {"utd": src.tensors["utd"]}, {**src.meta, "id": "old"})
    terms = [{"task": "colour", "source": ["src", "old"], "weight": 0.5}]
    result = run_ptc("check", write_recipe(tmp_path / "r.yaml", world, terms, bank=str(bank_copy)))
    assert result.returncode == 2
    assert (
        "descriptor 'old' of task 'colour' has no source affinities, which `source_weights: agreement`"
        in result.stderr
    )
    assert "source_weights: uniform" in result.stderr
    terms[0]["source_weights"] = "uniform"
    result = run_ptc("check", write_recipe(tmp_path / "r.yaml", world, terms, bank=str(bank_copy)))
    assert result.returncode == 0, result.stderr
    assert "normalised of 2, uniform weights" in result.stdout


def test_a_relative_term_solves_the_expert_minus_the_targets_own_affinities(
    world, two_sources, tmp_path
):
    terms = [{"task": "colour", "source": "other", "kind": "relative", "weight": -0.5}]
    recipe = write_recipe(
        tmp_path / "r.yaml", world, terms, bank=str(two_sources.root), solve={"ridge": RIDGE}
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    _, grid = _target_grid(world, two_sources, "colour")
    entry = two_sources.descriptor("colour", "other")
    s = entry.tensors["source_affinity"].double().numpy()
    t = affinity(grid.inputs.double(), grid.class_rows.double()).numpy()
    relative = (
        t.mean()
        + t.std(ddof=1) * (entry.tensors["utd"].double().numpy() + s - s.mean()) / s.std(ddof=1)
        - t
    )
    expected = -0.5 * solve_dense(grid.inputs, grid.class_rows, torch.from_numpy(relative), RIDGE)
    _, edits = _built_edits(tmp_path / "out")
    assert torch.allclose(edits[0], expected, atol=1e-6, rtol=1e-5)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert (
        report["terms"][0]["kind"] == "relative"
        and report["terms"][0]["source"] == "other (relative)"
    )


def test_a_relative_term_on_a_descriptor_without_source_affinities_is_refused(
    world, bank_copy, tmp_path
):
    bank = Bank(bank_copy)
    src = bank.descriptor("colour", "src")
    bank.put_descriptor("colour", "old", {"utd": src.tensors["utd"]}, {**src.meta, "id": "old"})
    terms = [{"task": "colour", "source": "old", "kind": "relative", "weight": 0.5}]
    result = run_ptc("check", write_recipe(tmp_path / "r.yaml", world, terms, bank=str(bank_copy)))
    assert result.returncode == 2
    assert "terms[0]: descriptor 'old' of task 'colour' has no source affinities" in result.stderr
    assert "ptc descriptor add" in result.stderr


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"terms": [{"task": "colour", "source": ["src", "src"], "weight": 0.5}]},
            "descriptor ids repeat",
        ),
        (
            {
                "terms": [
                    {"task": "colour", "source": ["src"], "source_weights": [1, 2], "weight": 0.5}
                ]
            },
            "source_weights has 2 numbers for 1 sources",
        ),
        (
            {
                "terms": [
                    {
                        "task": "colour",
                        "source": ["src"],
                        "source_weights": [1],
                        "combine": "median",
                        "weight": 0.5,
                    }
                ]
            },
            "cannot weight a median",
        ),
        (
            {
                "terms": [
                    {
                        "task": "colour",
                        "source": ["src", "x"],
                        "source_weights": "agreement",
                        "combine": "median",
                        "weight": 0.5,
                    }
                ]
            },
            "agreement cannot weight a median",
        ),
        (
            {
                "terms": [
                    {
                        "task": "colour",
                        "source": ["src", "x"],
                        "source_weights": "votes",
                        "weight": 0.5,
                    }
                ]
            },
            "terms[0].source_weights: expected agreement, uniform or a list of positive numbers, not 'votes'",
        ),
        ({"terms": [{"task": "colour", "source": "src", "kind": "ratio", "weight": 0.5}]}, "kind"),
        (
            {"strength": {"mode": "auto", "control": ["colour"]}},
            "strength.control[0]: 'colour' is a term's task",
        ),
        ({"strength": "sometimes"}, "strength"),
        ({"verify": {"certify": {"nope": "."}}}, "verify.certify.nope: 'nope' is no term's task"),
        (
            {"route": "adapter", "verify": {"certify": {"colour": "."}}},
            "verify.certify: the certificate needs",
        ),
    ],
)
def test_bad_beyond_settings_are_one_clear_line(world, tmp_path, change, message):
    result = run_ptc("check", write_recipe(tmp_path / "r.yaml", world, **change))
    assert result.returncode == 2, result.stdout
    assert message in result.stderr and len(result.stderr.strip().splitlines()) <= 2


def _objective(terms, grids, controls, magnitudes, folds, mu):
    """The auto-strength objective written out directly, with solve_dense."""
    total = 0.0
    for g in dict.fromkeys(t for t, _, _ in terms):
        emb, goal = grids[g], sum(s * u for t, u, s in terms if t == g)
        n, residual = emb.inputs.shape[0], 0.0
        for k in range(folds):
            held = torch.arange(n) % folds == k
            predicted = 0
            for (task, u, sign), m in zip(terms, magnitudes):
                fit = ~(torch.arange(grids[task].inputs.shape[0]) % folds == k)
                a = solve_dense(grids[task].inputs[fit], grids[task].class_rows, u[fit], RIDGE)
                f = emb.inputs[held].double()
                predicted = (
                    predicted
                    + m * sign * (f / f.norm(dim=1, keepdim=True)) @ a.T @ emb.class_rows.double().T
                )
            residual += float((predicted - goal[held]).square().sum())
        total += residual / float(goal.square().sum())
    for emb in controls.values():
        pre = affinity(emb.inputs.double(), emb.class_rows.double())
        f = emb.inputs.double() / emb.inputs.double().norm(dim=1, keepdim=True)
        moved = sum(
            m
            * sign
            * f
            @ solve_dense(grids[task].inputs, grids[task].class_rows, u, RIDGE).T
            @ emb.class_rows.double().T
            for (task, u, sign), m in zip(terms, magnitudes)
        )
        # only what differs between classes can flip a prediction
        moved = moved - moved.mean(1, keepdim=True)
        total += (
            mu
            / len(controls)
            * float(moved.square().sum())
            / float((pre - pre.mean(1, keepdim=True)).square().sum())
        )
    return total


def test_auto_strengths_minimise_the_held_out_objective(world):
    bank = Bank(world.bank)
    target, colour = _target_grid(world, bank, "colour")
    shape = embed_grid(target, bank.task("shape"), bank, progress=False)
    terms = [("colour", bank.descriptor("colour", "src").tensors["utd"].double(), 1.0)]
    config = Strength(mode="auto", folds=4, control_weight=0.5, max_weight=10.0)
    chosen = choose_strengths(terms, {"colour": colour}, {"shape": shape}, RIDGE, config)
    m = abs(chosen["weights"][0])
    assert m > 0
    at = lambda value: _objective(terms, {"colour": colour}, {"shape": shape}, [value], 4, 0.5)  # noqa: E731
    best = at(m)
    assert best <= min(at(m * 0.9), at(m * 1.1)) + 1e-12
    assert best <= min(at(v) for v in np.linspace(0.0, 3 * m, 31)) + 1e-12


def test_two_auto_strengths_jointly_minimise_it_and_keep_their_signs(world):
    bank = Bank(world.bank)
    target, colour = _target_grid(world, bank, "colour")
    shape = embed_grid(target, bank.task("shape"), bank, progress=False)
    grids = {"colour": colour, "shape": shape}
    terms = [
        ("colour", bank.descriptor("colour", "src").tensors["utd"].double(), 1.0),
        ("shape", bank.descriptor("shape", "src").tensors["utd"].double(), -1.0),
    ]
    chosen = choose_strengths(terms, grids, {}, RIDGE, Strength(mode="auto", max_weight=10.0))
    w = chosen["weights"]
    assert w[0] >= 0 and w[1] <= 0
    magnitudes = [abs(v) for v in w]
    best = _objective(terms, grids, {}, magnitudes, 4, 1.0)
    for dx, dy in [(0.05, 0), (-0.05, 0), (0, 0.05), (0, -0.05)]:
        nudged = [max(0.0, magnitudes[0] * (1 + dx)), max(0.0, magnitudes[1] * (1 + dy))]
        assert best <= _objective(terms, grids, {}, nudged, 4, 1.0) + 1e-12


def test_a_build_with_auto_strength_applies_and_reports_the_chosen_weights(world, tmp_path):
    recipe = write_recipe(
        tmp_path / "r.yaml",
        world,
        [{"task": "colour", "source": "src", "weight": 0.5}],
        strength="auto",
        solve={"ridge": RIDGE},
    )
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    strength = report["strength"]
    assert strength["mode"] == "auto" and strength["control_tasks"] == ["shape"]
    chosen = strength["weights"][0]["chosen"]
    assert report["terms"][0]["weight"] == chosen and report["terms"][0]["written_weight"] == 0.5
    assert f"strength auto: colour/src {chosen:+.3f}" in result.stdout
    bank = Bank(world.bank)
    _, grid = _target_grid(world, bank, "colour")
    expected = chosen * solve_dense(
        grid.inputs, grid.class_rows, bank.descriptor("colour", "src").tensors["utd"], RIDGE
    )
    _, edits = _built_edits(tmp_path / "out")
    assert torch.allclose(edits[0], expected, atol=1e-6, rtol=1e-5)


# -- the certificate through builds and `ptc certify` ---------------------------------------------
@pytest.fixture(scope="module")
def certified(world, tmp_path_factory):
    folder = tmp_path_factory.mktemp("certified")
    data = {t: str(world.tasks[t].parent / "test") for t in ("colour", "shape")}
    recipe = write_recipe(folder / "r.yaml", world, verify={"certify": data})
    result = run_ptc("build", recipe)
    assert result.returncode == 0, result.stderr
    return folder / "out", result, data


def test_a_build_certifies_each_task_and_no_certified_prediction_changes(certified):
    out, result, _ = certified
    report = json.loads((out / "report.json").read_text())
    for task in ("colour", "shape"):
        figures = report["certificate"][task]
        assert figures["certified_changed"] == 0 and figures["inputs"] > 0
        assert f"certificate {task}" in result.stdout


def test_ptc_certify_recomputes_the_builds_certificate_from_the_output(certified):
    out, _, data = certified
    report = json.loads((out / "report.json").read_text())
    result = run_ptc("certify", out, "--data", data["colour"], "--task", "colour", "--json")
    assert result.returncode == 0, result.stderr
    figures = json.loads(result.stdout)
    for key in ("inputs", "certified", "changed", "certified_changed"):
        assert figures[key] == report["certificate"]["colour"][key]
    assert figures["certified_fraction"] == pytest.approx(
        report["certificate"]["colour"]["certified_fraction"]
    )


def test_ptc_certify_refuses_what_it_cannot_certify(certified, tmp_path, world):
    out, _, data = certified
    result = run_ptc("certify", out, "--data", data["colour"])
    assert (
        result.returncode == 2
        and "edits 2 tasks (colour, shape)" in result.stderr
        and "--task" in result.stderr
    )
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    terms = copy / "terms.safetensors"
    terms.write_bytes(terms.read_bytes()[:-8] + bytes(8))
    result = run_ptc("certify", copy, "--data", data["colour"], "--task", "colour")
    assert result.returncode == 2 and "does not match the hash in" in result.stderr
    terms.unlink()
    result = run_ptc("certify", copy, "--data", data["colour"], "--task", "colour")
    assert result.returncode == 2 and "no terms.safetensors" in result.stderr
