"""Executing a planned build (mergekit's execute half): load the target, embed each grid once
(cached), let the recipe's route produce the edit, verify it, and export into a staging folder
that is renamed into place only when every check passed. `plan` lives in plan.py, the routes
in routes.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from ptc import __version__, targets
from ptc.compiler.build.report import BuildReport
from ptc.compiler.edit.routes import ROUTES, Check, Edit, Run, grid_goals
from ptc.compiler.edit.strength import choose_strengths, strength_report
from ptc.compiler.edit.terms import resolve_descriptors, with_weights
from ptc.compiler.embed import (
    GridEmbeddings,
    embed_grid,
    embed_probe_files_for_edit,
    model_info,
    model_key,
)
from ptc.compiler.export.card import model_card
from ptc.compiler.export.card_plot import PLOT_NAME, evaluation_png
from ptc.compiler.export.fp16 import fp16_variant
from ptc.compiler.export.onnx_graph import interface
from ptc.compiler.export.onnx_run import min_row_cosine, run_onnx
from ptc.compiler.export.stamp import stamp_safetensors
from ptc.compiler.export.tower_cache import write_tower
from ptc.compiler.export.triton import write_triton_model
from ptc.compiler.recipe.lock import (
    LOCK_NAME,
    RUN_RECORD,
    check_locked,
    describe,
    differences,
    lock_document,
    lock_inputs,
    output_files,
    previous_lock,
    recipe_lock_path,
    refuse_foreign_lock,
    sha256_of,
    write_recipe_lock,
)
from ptc.compiler.recipe.options import Options
from ptc.compiler.recipe.plan import Plan, plan  # noqa: F401  (build.plan stays the public entry point)
from ptc.compiler.verify.certify import (
    TERMS_FILE,
    certificate,
    input_files,
    task_edits,
    write_terms,
)
from ptc.compiler.verify.checks import (
    descriptor_residual,
    max_abs_difference,
    require,
    require_at_least,
)
from ptc.compiler.verify.evaluate import zero_shot_accuracy
from ptc.devices import CPU, on_device, place
from ptc.errors import OutputError, VerifyError, library_errors
from ptc.files import file_sha256, staged_directory, write_bytes_atomic, write_json_atomic
from ptc.targets.base import DualEncoder, Exportable, Family, OnnxTower, batch_rows

# The target's own embeddings of the check inputs are read from the grid cache where fp32 passes
# on a CPU made it: the very numbers the solve used, with no forward pass. A cache made on a GPU
# or in reduced precision is not the CPU fp32 reference, so there the target runs the batch.
FP32_CPU = {"device": "cpu", "precision": "fp32"}


def _check_set(
    plan_: Plan, target: DualEncoder, grids: dict[str, GridEmbeddings], count: int
) -> Check:
    """Probe files spread evenly over the recipe's grids, `count` in all, their batch, and the
    target's (z, R) of them where the cache holds a CPU fp32 reference."""
    probes = {pt.task.name: pt.task.probes for pt in plan_.terms}
    per_grid = max(1, count // len(probes))
    picked = []
    for name, files in probes.items():
        picked.extend(
            (name, index)
            for index in range(0, len(files), max(1, len(files) // per_grid))[:per_grid]
        )
    picked = picked[: max(count, len(probes))]
    paths = [probes[name][index] for name, index in picked]
    base = None
    if all(grids[name].made_by == FP32_CPU for name in probes):
        z = torch.stack([grids[name].inputs[index] for name, index in picked])
        rows = [grids[name].regressors for name, _ in picked]
        base = (
            z,
            None
            if rows[0] is None
            else torch.stack([r[index] for r, (_, index) in zip(rows, picked)]),
        )
    return Check(paths, target.load_inputs(paths), base)


def _residuals(plan_: Plan, grids: dict[str, GridEmbeddings], edit: Edit) -> dict[str, float]:
    goals = grid_goals(plan_, grids)
    return {
        name: descriptor_residual(edit.grid_inputs[name], emb.inputs, emb.class_rows, goals[name])
        for name, emb in grids.items()
    }


# The reload is checked end to end on a few of the check inputs and prompts (weights, config,
# tokenizer); its preprocessing on all of them. The edited model's own figures are the route's.
RELOAD_CHECKS = 4


def _export_native(
    plan_: Plan, edited: Family, check: Check, edit: Edit, staging: Path, provenance: dict, run: Run
) -> dict:
    with run.stage("export_native"):
        scheme = edited.save_native(staging / "model")
        stamp_safetensors(staging / "model", provenance)
    with run.stage("verify_reload"):
        reloaded = targets.load(f"{scheme}:{staging / 'model'}")
        batch = reloaded.load_inputs(check.paths)
        if any(not torch.equal(batch[name], check.batch[name]) for name in check.batch):
            raise VerifyError(
                "verification failed: the reloaded checkpoint preprocesses inputs differently",
                "nothing was written; the family's save_native loses part of its processor",
            )
        few = batch_rows(batch, slice(0, RELOAD_CHECKS))
        prompts = plan_.terms[0].task.prompts[:RELOAD_CHECKS]
        diff = max(
            max_abs_difference(reloaded.embed_inputs(few), edit.check_outputs[:RELOAD_CHECKS]),
            max_abs_difference(reloaded.embed_prompts(prompts), edited.embed_prompts(prompts)),
        )
    return {
        "reload_max_abs_diff": require(
            "reload_max_abs_diff", diff, plan_.recipe.verify.equivalence_atol
        ),
        "native_ref": f"{scheme}:model",
    }


def _export_onnx_towers(
    plan_: Plan,
    target: Exportable,
    edit: Edit,
    check: Check,
    staging: Path,
    provenance: dict,
    run: Run,
) -> dict:
    verify = plan_.recipe.verify
    # the export cache is one per model, whatever the precision
    weights_key = model_info(target).weights_key
    diffs, cosines, triton_models, files, provider, interfaces = [], [], [], [], None, {}
    for index, (base, tower) in enumerate(zip(target.onnx_towers(), edit.edited.onnx_towers())):
        path = staging / "onnx" / f"{tower.name}.onnx"
        with library_errors(
            f"ONNX tower {tower.name}",
            "nothing was written; the graph or its cached base in the "
            f"bank is damaged: run `ptc bank verify --bank {plan_.bank.root}`",
            OutputError,
        ):
            figures = _export_onnx_tower(
                plan_, index, base, tower, edit, check, path, provenance, run, weights_key
            )
        diffs.append(figures["diff"])
        cosines += figures["cosines"]
        provider = figures["provider"]
        files += figures["files"]
        interfaces.update(figures["interfaces"])
        triton_models += figures["triton_models"]
    figures = {
        "onnx_max_abs_diff": require("onnx_max_abs_diff", max(diffs), verify.equivalence_atol),
        "onnx_provider": provider["ran"],
        "onnx_provider_requested": provider["requested"],
        "onnx_provider_fell_back": provider["fell_back"],
        "fp16_min_cosine": None,
        "triton_models": triton_models,
        "onnx_files": files,
        "onnx_interface": interfaces,
    }
    if cosines:
        figures["fp16_min_cosine"] = require_at_least(
            "fp16_min_cosine", min(cosines), verify.fp16_min_cosine
        )
    return figures


def _export_onnx_tower(
    plan_: Plan,
    index: int,
    base: OnnxTower,
    tower: OnnxTower,
    edit: Edit,
    check: Check,
    path: Path,
    provenance: dict,
    run: Run,
    weights_key: str,
) -> dict:
    """One tower written, run and compared, with its fp16 variant and Triton models as asked."""
    export = plan_.recipe.export
    cosines, triton_models, files, interfaces = [], [], [], {}
    with run.stage("export_onnx"):
        how = write_tower(
            plan_.bank, weights_key, base, tower, path, {**provenance, "ptc_precision": "fp32"}
        )
        run.counts[f"onnx_towers_{how}"] += 1
    with run.stage("verify_onnx"):
        if index == 0:  # the input tower, on the real check inputs the route already embedded
            inputs, expected = check.batch, edit.check_outputs
        else:
            inputs = tower.example_inputs
            with torch.inference_mode():
                expected = tower.module(**inputs)
        got, provider = run_onnx(path, inputs)
        diff = max_abs_difference(got, expected)
    variants = [(tower.name, path)]
    files.append(f"onnx/{path.name}")
    interfaces[f"onnx/{path.name}"] = interface(path)
    if "fp16" in export.precision:
        half = path.with_name(f"{tower.name}_fp16.onnx")
        with run.stage("export_fp16"):
            fp16_variant(path, half, provenance)
        with run.stage("verify_fp16"):
            cosines.append(min_row_cosine(run_onnx(half, inputs)[0], got))
        variants.append((f"{tower.name}_fp16", half))
        files.append(f"onnx/{half.name}")
        interfaces[f"onnx/{half.name}"] = interface(half)
    if "triton" in export.formats:
        with run.stage("export_triton"):
            for name, onnx_path in variants:
                write_triton_model(
                    path.parent.parent / "triton", name, onnx_path, export.triton.max_batch_size
                )
                triton_models.append(name)
    return {
        "diff": diff,
        "cosines": cosines,
        "provider": provider,
        "files": files,
        "interfaces": interfaces,
        "triton_models": triton_models,
    }


def _export_and_verify(
    plan_: Plan, target: Family, edit: Edit, check: Check, staging: Path, provenance: dict, run: Run
) -> dict:
    figures = dict(NOT_EXPORTED)
    if "safetensors" in plan_.recipe.export.formats:
        figures.update(_export_native(plan_, edit.edited, check, edit, staging, provenance, run))
    if "onnx" in plan_.recipe.export.formats:
        figures.update(_export_onnx_towers(plan_, target, edit, check, staging, provenance, run))
    return figures


def _evaluate(
    plan_: Plan, target: DualEncoder, edited: DualEncoder, options: Options
) -> dict[str, dict]:
    """Held-out zero-shot accuracy of the target and of the edited model (the one exported)."""
    term_tasks = {pt.task.name for pt in plan_.terms}
    figures = {}
    for task, folder in plan_.evaluations:
        before = zero_shot_accuracy(target, task, folder, options.batch_size, options.progress)[
            "accuracy"
        ]
        after = zero_shot_accuracy(edited, task, folder, options.batch_size, options.progress)[
            "accuracy"
        ]
        figures[task.name] = {
            "before": before,
            "after": after,
            "delta_points": 100 * (after - before),
            "role": "term" if task.name in term_tasks else "held out",
        }
    return figures


def _term_records(plan_: Plan, edit: Edit, residuals: dict[str, float]) -> list[dict]:
    return [
        {
            "task": pt.term.task,
            "source": pt.term.label,
            "weight": pt.weight,
            "written_weight": pt.term.weight,
            "kind": pt.term.kind,
            "sources": list(pt.term.sources),
            "combine": pt.term.combine if len(pt.term.sources) > 1 else None,
            "weighting": pt.term.weighting,
            "source_weights": pt.descriptor.meta.get("source_weights"),
            "grid_hash": pt.task.grid_hash,
            "descriptor_sha256": pt.descriptor.sha256,
            "source_descriptor_sha256": [entry.sha256 for entry in pt.sources],
            "operator_sha256": sha,
            "grid_residual": residuals[pt.task.name],
        }
        for pt, sha in zip(plan_.terms, edit.term_hashes)
    ]


def _choose_strengths(
    plan_: Plan, target: DualEncoder, grids: dict[str, GridEmbeddings], options: Options, run: Run
) -> tuple[Plan, dict | None]:
    """`strength: auto`: the label-free strengths of compiler/edit/strength.py; else the recipe's."""
    config = plan_.recipe.strength
    if config.mode != "auto":
        return plan_, None
    controls = {}
    for task in plan_.controls:
        with run.stage("embed"):
            controls[task.name] = embed_grid(
                target, task, plan_.bank, options.batch_size, options.progress
            )
            run.counts["embeddings_computed"] += controls[task.name].computed
    with run.stage("strength"):
        terms = [
            (pt.task.name, pt.descriptor.tensors["utd"], 1.0 if pt.term.weight > 0 else -1.0)
            for pt in plan_.terms
        ]
        result = choose_strengths(terms, grids, controls, plan_.recipe.solve.ridge, config)
    return with_weights(plan_, result["weights"]), strength_report(
        plan_.terms, result, config, list(controls)
    )


def _certify(
    plan_: Plan, target: DualEncoder, grids: dict[str, GridEmbeddings], edit: Edit, options: Options
) -> dict[str, dict]:
    """verify.certify: the composition certificate per task, failing on a certified change."""
    figures = {}
    if not plan_.certifications:
        return figures
    per_task = task_edits([{"task": pt.task.name} for pt in plan_.terms], edit.term_edits)
    full = sum(e.double() for e in edit.term_edits)
    for task, folder in plan_.certifications:
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
        require(
            f"certified predictions changed on {task.name}",
            figures[task.name]["certified_changed"],
            0,
        )
    return figures


def _terms_file_record(plan_: Plan, target: DualEncoder, terms: list[dict]) -> dict:
    tasks = {
        pt.task.name: {"classes": list(pt.task.classes), "templates": list(pt.task.templates)}
        for pt in plan_.terms
    }
    # No path: the file's bytes must not depend on where the output is written. Where the target
    # lies (its ref may be relative to the recipe) is the run's record (`_run_record`).
    where = {"ref": plan_.recipe.target, "input_fingerprint": target.input_fingerprint()}
    return {"terms": terms, "tasks": tasks, "target": where}


def _embed_grids(
    plan_: Plan, target: DualEncoder, options: Options, run: Run
) -> dict[str, GridEmbeddings]:
    grids: dict[str, GridEmbeddings] = {}
    for pt in plan_.terms:
        if pt.task.name not in grids:
            with run.stage("embed"):
                grids[pt.task.name] = embed_grid(
                    target, pt.task, plan_.bank, options.batch_size, options.progress
                )
                run.counts["embeddings_computed"] += grids[pt.task.name].computed
    return grids


def _load_target(plan_: Plan, options: Options, run: Run):
    """The target, its bank key and the lock's inputs; with --locked, refused here, before any
    forward pass, when an input drifted from the recipe's lock."""
    device = options.compute().resolved()  # a device this machine lacks is refused before loading
    with run.stage("load"):
        target = targets.load(plan_.recipe.target, plan_.base_dir)
        inputs = lock_inputs(plan_, target)
    if options.locked:
        check_locked(recipe_lock_path(plan_.recipe_path), inputs)
    elif options.export:
        refuse_foreign_lock(recipe_lock_path(plan_.recipe_path))  # before the build, not after it
    place(target, device, options.precision)
    return target, model_key(target), inputs, device


def execute(plan_: Plan, options: Options = Options()) -> BuildReport:
    if plan_.out_dir is None and options.export:
        raise OutputError(
            f"{plan_.recipe_path}: export.out: no output directory",
            "set export.out in the recipe or pass --out",
        )
    recipe, run = plan_.recipe, Run()
    target, target_key, inputs, device = _load_target(plan_, options, run)
    grids = _embed_grids(plan_, target, options, run)
    plan_ = resolve_descriptors(plan_, grids)
    plan_, strength = _choose_strengths(plan_, target, grids, options, run)
    target.to_device(CPU)  # the route, every verification and the export run in fp32 on the CPU
    check = _check_set(plan_, target, grids, recipe.verify.check_inputs)
    edit = ROUTES[recipe.route](plan_, target, target_key, grids, check, run, options)
    with run.stage("verify_residual"):
        residuals = _residuals(plan_, grids, edit)
        if recipe.verify.max_descriptor_residual is not None:
            require(
                "descriptor residual",
                max(residuals.values()),
                recipe.verify.max_descriptor_residual,
            )
    terms = _term_records(plan_, edit, residuals)
    with run.stage("certify"), on_device([target], device):
        certified = _certify(plan_, target, grids, edit, options)
    place(edit.edited, CPU, options.precision)  # evaluated as the target is
    with run.stage("evaluate"), on_device([target, edit.edited], device):
        evaluation = _evaluate(plan_, target, edit.edited, options)
    made_by = {name: emb.made_by for name, emb in grids.items()}
    derived = {
        "route": recipe.route,
        **edit.lock,
        "operators": [
            {k: t[k] for k in ("task", "source", "weight", "operator_sha256")} for t in terms
        ],
    }
    context = (
        plan_,
        target,
        edit,
        residuals,
        terms,
        evaluation,
        strength,
        certified,
        inputs,
        check,
        made_by,
    )
    if not options.export:  # verified up to the exports; nothing is written
        report = _report(*context, NOT_EXPORTED)
        report.run = _run_record(run, plan_)
        return report
    report, lock = _write_output(plan_, options, {**derived, "embeddings": made_by}, context, run)
    report.recipe_lock = None if options.locked else _update_recipe_lock(plan_, lock)
    report.out_dir = plan_.out_dir
    return report


def _write_output(
    plan_: Plan, options: Options, derived: dict, context: tuple, run: Run
) -> tuple[BuildReport, dict]:
    """Export, verify and write every file into a staging folder, renamed into place when all
    passed. The lock is written last, over every other file's bytes; returns (report, lock)."""
    _, target, edit, _, terms, _, _, _, inputs, check, _ = context
    recipe, lock_hash = plan_.recipe, sha256_of(inputs)
    try:
        with staged_directory(plan_.out_dir, replace=options.force) as staging:
            provenance = {
                "ptc_version": __version__,
                "ptc_recipe_sha256": inputs["recipe_sha256"],
                "ptc_lock_hash": lock_hash,
                "ptc_base_model": recipe.target,
                "ptc_route": recipe.route,
            }
            exported = _export_and_verify(plan_, target, edit, check, staging, provenance, run)
            report = _report(*context, exported)
            write_bytes_atomic(staging / "recipe.yaml", plan_.recipe_bytes)
            if edit.term_edits is not None:
                record = _terms_file_record(plan_, target, terms)
                write_terms(
                    staging / TERMS_FILE,
                    edit.term_edits,
                    record["terms"],
                    record["tasks"],
                    record["target"],
                )
            write_json_atomic(staging / "report.json", report.to_json())
            if report.evaluation:
                write_bytes_atomic(
                    staging / PLOT_NAME, evaluation_png(report.evaluation, report.terms)
                )
            write_bytes_atomic(
                staging / "README.md",
                model_card(target, recipe.target, edit.card, terms, report.to_json()).encode(
                    "utf-8"
                ),
            )
            outputs = {
                p.relative_to(staging).as_posix(): file_sha256(p) for p in output_files(staging)
            }
            lock = lock_document(inputs, derived, outputs)
            write_json_atomic(staging / LOCK_NAME, lock)
            report.run = _run_record(run, plan_)
            write_json_atomic(staging / RUN_RECORD, report.run)
    except FileExistsError:
        raise OutputError(
            f"output directory {plan_.out_dir} appeared during the build",
            "pass --force to replace it",
        ) from None
    return report, lock


def _update_recipe_lock(plan_: Plan, document: dict) -> dict:
    """The recipe's lock follows its last build: written, or updated with what changed said."""
    path = recipe_lock_path(plan_.recipe_path)
    before = previous_lock(path)
    if before is not None and before == document:
        return {"path": str(path), "state": "unchanged", "changes": []}
    changes = (
        []
        if before is None
        else [
            describe(d) for d in differences(before, document) if not d["path"].startswith("seal")
        ]
    )
    write_recipe_lock(path, document)
    return {
        "path": str(path),
        "state": "written" if before is None else "updated",
        "changes": changes,
    }


NOT_EXPORTED = {
    "onnx_max_abs_diff": None,
    "onnx_provider": None,
    "onnx_provider_requested": None,
    "onnx_provider_fell_back": None,
    "reload_max_abs_diff": None,
    "native_ref": None,
    "fp16_min_cosine": None,
    "triton_models": [],
    "onnx_files": [],
    "onnx_interface": {},
}


def _peak_rss_mb() -> float:
    """This process's peak resident memory. Linux's VmHWM is its own address space's: getrusage's
    maxrss also keeps the parent's size at fork across exec, so a build started by a large
    process (a benchmark, a test runner) would report that instead."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _run_record(run: Run, plan_: Plan) -> dict:
    """How this run went (run.json): what differs from one build of the same inputs to the next,
    and where it found its target's relative reference (for `ptc certify`): the recipe's folder,
    absolute and relative to the output (a tree moved whole still resolves)."""
    record = {
        "cache": dict(run.counts),
        "timings": dict(run.timings),
        "peak_rss_mb": _peak_rss_mb(),
    }
    if plan_.out_dir is not None:
        record["target_base_dir"] = {
            "absolute": str(Path(plan_.base_dir).resolve()),
            "from_output": os.path.relpath(plan_.base_dir, plan_.out_dir),
        }
    return record


def _report(
    plan_: Plan,
    target: DualEncoder,
    edit: Edit,
    residuals,
    terms,
    evaluation,
    strength,
    certified,
    inputs,
    check: Check,
    made_by: dict,
    exported: dict,
) -> BuildReport:
    """What was built and how it verified: report.json's content, the same for the same inputs."""
    recipe = plan_.recipe
    verify = {
        "linearity": edit.report["linearity"],
        "equivalence": {
            "torch_max_abs_diff": edit.torch_max_abs_diff,
            **{
                k: v
                for k, v in exported.items()
                if k not in ("native_ref", "triton_models", "onnx_files", "onnx_interface")
            },
            "check_inputs": len(check.paths),
        },
        "descriptor_residual": residuals,
        "tolerances": recipe.verify.model_dump(),
    }
    return BuildReport(
        ptc_version=__version__,
        recipe=plan_.recipe_path.name,
        route=recipe.route,
        target=inputs["target"],
        native_ref=exported["native_ref"],
        embed_dim=target.embed_dim,
        terms=terms,
        route_report={k: v for k, v in edit.report.items() if k != "linearity"},
        verify=verify,
        strength=strength or {"mode": "fixed"},
        certificate=certified,
        evaluation=evaluation,
        lock_hash=sha256_of(inputs),
        formats=list(recipe.export.formats) if exported is not NOT_EXPORTED else [],
        precision=list(recipe.export.precision),
        triton_models=exported["triton_models"],
        onnx_files=exported["onnx_files"],
        onnx_interface=exported["onnx_interface"],
        embeddings=made_by,
    )
