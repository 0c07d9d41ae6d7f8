"""The build's stages before anything is written, each taking the previous one's result:

load_target  -> Target      the model, its bank key, the lock's inputs, the device
make_edit    -> EditedModel grids embedded, descriptors resolved, strengths, the route's edit
check_edit   -> CheckedEdit residuals, the certificate, the held-out evaluation
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch

from ptc import targets
from ptc.compiler.bank.store import TaskRecord
from ptc.compiler.edit.routes import ROUTES, Check, Edit, Run, grid_goals
from ptc.compiler.edit.strength import choose_strengths, strength_report
from ptc.compiler.edit.terms import resolve_descriptors, with_weights
from ptc.compiler.embed import (
    ONNXRUNTIME,
    TORCH,
    GridEmbeddings,
    embed_grid,
    embed_probe_files_for_edit,
    model_info,
    model_key,
)
from ptc.compiler.export.onnx_embed import OnnxInputPass, choose_runtime, input_forward
from ptc.compiler.export.runtime_speed import (
    SAMPLE_INPUTS,
    chosen_runtime,
    images_per_second,
    record_choice,
)
from ptc.compiler.method.descriptor import summed
from ptc.compiler.recipe.lock import (
    check_locked,
    lock_inputs,
    recipe_lock_path,
    refuse_foreign_lock,
)
from ptc.compiler.recipe.options import Options
from ptc.compiler.recipe.plan import Plan
from ptc.compiler.verify.certify import Certificate, certificate, input_files, task_edits
from ptc.compiler.verify.checks import descriptor_residual, require
from ptc.compiler.verify.evaluate import HeldOut, zero_shot_accuracy
from ptc.devices import CPU, on_device, place
from ptc.targets.base import DualEncoder, Family

# The target's own embeddings of the check inputs are read from the grid cache where fp32 passes
# on a CPU made it: the very numbers the solve used, with no forward pass. A cache made on a GPU
# or in reduced precision is not the CPU fp32 reference, so there the target runs the batch.
FP32_CPU = {"device": "cpu", "precision": "fp32", "runtime": TORCH}


@dataclass(frozen=True)
class Target:
    """The loaded target: the model, its key in the bank, the lock's inputs, where it embeds."""

    model: Family
    key: str
    lock_inputs: dict[str, Any]
    device: torch.device
    runtime: str = TORCH  # what runs its embedding passes (compiler/export/onnx_embed.py)
    input_pass: OnnxInputPass | None = None  # its input pass there, made once


@dataclass(frozen=True)
class EditedModel:
    """The route's edit and what it was made from: the plan with its descriptors resolved and
    its strengths chosen, the target's grid embeddings, and the check batch."""

    plan: Plan
    grids: dict[str, GridEmbeddings]
    check: Check
    edit: Edit
    strength: dict[str, Any] | None  # `strength: auto`'s report; None for fixed strengths


@dataclass(frozen=True)
class CheckedEdit:
    """What the edit showed before export: per-grid residuals, the composition certificate and
    the held-out zero-shot accuracy, per task."""

    residuals: dict[str, float]
    certified: dict[str, Certificate]
    evaluation: dict[str, HeldOut]


def load_target(plan: Plan, options: Options, run: Run) -> Target:
    """The target, its bank key and the lock's inputs; with --locked, refused here, before any
    forward pass, when an input drifted from the recipe's lock."""
    device = options.compute().resolved()  # a device this machine lacks is refused before loading
    with run.stage("load"):
        model = targets.load(plan.recipe.target, plan.base_dir)
        inputs = lock_inputs(plan, model)
    if options.locked:
        check_locked(recipe_lock_path(plan.recipe_path), inputs)
    elif options.export:
        refuse_foreign_lock(recipe_lock_path(plan.recipe_path))  # before the build, not after it
    place(model, device, options.precision)
    runtime, onnx_pass = embedding_runtime(plan, model, options, run)
    return Target(model, model_key(model, runtime), inputs, device, runtime, onnx_pass)


def embedding_runtime(
    plan: Plan, model: Family, options: Options, run: Run
) -> tuple[str, OnnxInputPass | None]:
    """onnxruntime on the base export the build writes anyway, where it can run
    (compiler/export/onnx_embed.py), and, under `auto`, where it measured no slower than torch
    on this machine (compiler/export/runtime_speed.py); its pass, opened when first used."""
    export_due = options.export and "onnx" in plan.recipe.export.formats
    runtime = choose_runtime(model, plan.bank, options.embed_runtime, export_due)
    if runtime == TORCH:
        return TORCH, None
    onnx_pass = input_forward(model, plan.bank)
    if options.embed_runtime == "auto":
        weights_key = model_info(model).weights_key
        runtime = chosen_runtime(
            plan.bank,
            weights_key,
            lambda: measure_runtime(plan, model, weights_key, onnx_pass, run),
        )
        if runtime == TORCH:
            onnx_pass.close()
            return TORCH, None
    return runtime, onnx_pass


def measure_runtime(
    plan: Plan, model: Family, weights_key: str, onnx_pass: OnnxInputPass, run: Run
) -> str:
    """Time torch, then onnxruntime (its session opened with torch's tower paged out), on the
    build's first probe files (compiler/export/runtime_speed.py); the choice is recorded in the
    bank."""
    sample = list(plan.terms[0].task.probes[:SAMPLE_INPUTS])
    with run.stage("measure_runtime"):
        batch = model.load_inputs(sample)
        rates = {TORCH: images_per_second(model.embed_for_edit, batch)}
    with run.stage("export_base"):
        onnx_pass.export()
    with run.stage("open_session"):  # graph optimisation, weights prepacked
        forward = onnx_pass()
    with run.stage("measure_runtime"):
        rates[ONNXRUNTIME] = images_per_second(forward, batch)
    return record_choice(model, plan.bank, weights_key, rates, len(sample))


def make_edit(plan: Plan, target: Target, options: Options, run: Run) -> EditedModel:
    grids = embed_grids(plan, target, options, run)
    plan = resolve_descriptors(plan, grids)
    plan, strength = choose_term_strengths(plan, target, grids, options, run)
    if target.input_pass is not None:
        target.input_pass.close()  # every grid is embedded; what follows runs torch
    target.model.to_device(
        CPU
    )  # the route, every verification and the export run in fp32 on the CPU
    check = check_set(plan, target.model, grids, plan.recipe.verify.check_inputs)
    edit = ROUTES[plan.recipe.route](plan, target.model, target.key, grids, check, run, options)
    return EditedModel(plan, grids, check, edit, strength)


def check_edit(edited: EditedModel, target: Target, options: Options, run: Run) -> CheckedEdit:
    plan, edit, verify = edited.plan, edited.edit, edited.plan.recipe.verify
    with run.stage("verify_residual"):
        residuals = grid_residuals(plan, edited.grids, edit)
        if verify.max_descriptor_residual is not None:
            require("descriptor residual", max(residuals.values()), verify.max_descriptor_residual)
    with run.stage("certify"), on_device([target.model], target.device):
        certified = certify(plan, target.model, edited.grids, edit, options)
    place(edit.edited, CPU, options.precision)  # evaluated as the target is
    with run.stage("evaluate"), on_device([target.model, edit.edited], target.device):
        evaluation = evaluate(plan, target.model, edit.edited, options)
    return CheckedEdit(residuals, certified, evaluation)


def embed_grids(
    plan: Plan, target: Target, options: Options, run: Run
) -> dict[str, GridEmbeddings]:
    grids: dict[str, GridEmbeddings] = {}
    for pt in plan.terms:
        if pt.task.name not in grids:
            grids[pt.task.name] = embed_target_grid(plan, target, pt.task, options, run)
    return grids


def embed_target_grid(
    plan: Plan, target: Target, task: TaskRecord, options: Options, run: Run
) -> GridEmbeddings:
    """One grid through the target on its runtime. Where that is onnxruntime and the grid is not
    cached, the base export it runs is made (exported once into the bank) in a stage of its own,
    `export_base`, and its session opened in another, `open_session`, apart from the embed
    stage."""
    runtime = None
    if target.input_pass is not None:
        if not (plan.bank.root / plan.bank.embeddings_rel(target.key, task.grid_hash)).is_file():
            with run.stage("export_base"):
                target.input_pass.export()
            with run.stage("open_session"):
                target.input_pass()
        runtime = (target.runtime, target.input_pass)
    with run.stage("embed"):
        grid = embed_grid(
            target.model, task, plan.bank, options.batch_size, options.progress, runtime
        )
    run.counts["embeddings_computed"] += grid.computed
    return grid


def choose_term_strengths(
    plan: Plan,
    target: Target,
    grids: dict[str, GridEmbeddings],
    options: Options,
    run: Run,
) -> tuple[Plan, dict[str, Any] | None]:
    """`strength: auto`: the label-free strengths of edit/strength.py; else the recipe's."""
    config = plan.recipe.strength
    if config.mode != "auto":
        return plan, None
    controls = {}
    for task in plan.controls:
        controls[task.name] = embed_target_grid(plan, target, task, options, run)
    with run.stage("strength"):
        terms = [
            (pt.task.name, pt.resolved.tensors["utd"], 1.0 if pt.term.weight > 0 else -1.0)
            for pt in plan.terms
        ]
        result = choose_strengths(terms, grids, controls, plan.recipe.solve.ridge, config)
    report = strength_report(plan.terms, result, config, list(controls))
    return with_weights(plan, result["weights"]), report


def check_set(
    plan: Plan, target: DualEncoder, grids: dict[str, GridEmbeddings], count: int
) -> Check:
    """Probe files spread evenly over the recipe's grids, `count` in all, their batch, their key
    (the grids' hashes and the files' places in them), and the target's (z, R) of them where
    the grid cache holds a CPU fp32 torch reference; likewise its prompts' embeddings (prompts
    run on torch whatever ran the inputs)."""
    probes = {pt.task.name: pt.task.probes for pt in plan.terms}
    grid_hashes = {pt.task.name: pt.task.grid_hash for pt in plan.terms}
    per_grid = max(1, count // len(probes))
    picked: list[tuple[str, int]] = []
    for name, files in probes.items():
        step = max(1, len(files) // per_grid)
        picked.extend((name, index) for index in range(0, len(files), step)[:per_grid])
    picked = picked[: max(count, len(probes))]
    paths = [probes[name][index] for name, index in picked]
    key = hashlib.sha256(
        "|".join(f"{grid_hashes[name]}:{index}" for name, index in picked).encode()
    ).hexdigest()[:32]
    base = None
    prompts: dict[str, torch.Tensor] = {}
    for pt in plan.terms:
        grid = grids[pt.task.name]
        if grid.prompts is not None and _fp32_cpu(grid.made_by):
            prompts.update(zip(pt.task.prompts, grid.prompts))
    if all(grids[name].made_by == FP32_CPU for name in probes):
        z = torch.stack([grids[name].inputs[index] for name, index in picked])
        rows = [grids[name].regressors for name, _ in picked]
        r = None
        if all(row is not None for row in rows):
            r = torch.stack([row[i] for row, (_, i) in zip(rows, picked) if row is not None])
        base = (z, r)
    return Check(paths, target.load_inputs(paths), key, base, prompts)


def _fp32_cpu(made_by: dict[str, str] | None) -> bool:
    return made_by is not None and all(
        made_by.get(k) == FP32_CPU[k] for k in ("device", "precision")
    )


def grid_residuals(plan: Plan, grids: dict[str, GridEmbeddings], edit: Edit) -> dict[str, float]:
    goals = grid_goals(plan, grids)
    return {
        name: descriptor_residual(edit.grid_inputs[name], emb.inputs, emb.class_rows, goals[name])
        for name, emb in grids.items()
    }


def certify(
    plan: Plan,
    target: DualEncoder,
    grids: dict[str, GridEmbeddings],
    edit: Edit,
    options: Options,
) -> dict[str, Certificate]:
    """verify.certify: the composition certificate per task, failing on a certified change."""
    figures: dict[str, Certificate] = {}
    if not plan.certifications:
        return figures
    if edit.term_edits is None:  # the plan refuses verify.certify on a route without them
        raise RuntimeError(f"route {plan.recipe.route} gave no per-term edits to certify")
    per_task = task_edits([{"task": pt.task.name} for pt in plan.terms], edit.term_edits)
    full = summed(e.double() for e in edit.term_edits)
    for task, folder in plan.certifications:
        z, r = embed_probe_files_for_edit(
            target,
            input_files(folder),
            options.batch_size,
            f"certify {task.name}",
            options.progress,
        )
        figures[task.name] = certificate(
            z, r, grids[task.name].class_rows, per_task[task.name], full
        )
        changed = figures[task.name]["certified_changed"]
        require(f"certified predictions changed on {task.name}", changed, 0)
    return figures


def evaluate(
    plan: Plan, target: DualEncoder, edited: DualEncoder, options: Options
) -> dict[str, HeldOut]:
    """Held-out zero-shot accuracy of the target and of the edited model (the one exported)."""
    term_tasks = {pt.task.name for pt in plan.terms}
    figures: dict[str, HeldOut] = {}
    for task, folder in plan.evaluations:
        before, after = (
            zero_shot_accuracy(model, task, folder, options.batch_size, options.progress)[
                "accuracy"
            ]
            for model in (target, edited)
        )
        figures[task.name] = {
            "before": before,
            "after": after,
            "delta_points": 100 * (after - before),
            "role": "term" if task.name in term_tasks else "held out",
        }
    return figures
