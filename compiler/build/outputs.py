"""Writing a checked edit: every format exported and verified in a staging folder, the
report, the model card, the terms file and the lock written last over every other file's
bytes, then the folder renamed into place; and the recipe's lock brought up to date."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ptc import __version__, targets
from ptc.compiler.build.report import BuildReport, Exported, build_report, run_record
from ptc.compiler.build.stages import CheckedEdit, EditedModel, Target
from ptc.compiler.edit.routes import Run
from ptc.compiler.embed import model_info
from ptc.compiler.export.card import base_model_name, model_card
from ptc.compiler.export.card_plot import PLOT_NAME, evaluation_png
from ptc.compiler.export.fp16 import fp16_variant
from ptc.compiler.export.int8 import int8_variant
from ptc.compiler.export.onnx_graph import Interface, interface, onnx_files
from ptc.compiler.export.onnx_run import ProviderRun, min_row_cosine, run_onnx
from ptc.compiler.export.serving import (
    LONG_PROMPT,
    preprocess_difference,
    preprocess_tolerance,
    token_agreement,
    write_contract,
)
from ptc.compiler.export.stamp import stamp_safetensors
from ptc.compiler.export.tower_cache import cache_base, export_key, write_tower
from ptc.compiler.export.triton import write_triton_model
from ptc.compiler.method.descriptor import normalise
from ptc.compiler.recipe.lock import (
    LOCK_NAME,
    RUN_RECORD,
    LockDocument,
    describe,
    differences,
    lock_document,
    output_files,
    previous_lock,
    recipe_lock_path,
    sha256_of,
    write_recipe_lock,
)
from ptc.compiler.recipe.options import Options
from ptc.compiler.recipe.plan import Plan, TermRecord
from ptc.compiler.serve.client import OnnxClient
from ptc.compiler.serve.contract import TOKENIZER_FILE, read_contract
from ptc.compiler.verify.certify import TERMS_FILE, write_terms
from ptc.compiler.verify.checks import max_abs_difference, require, require_at_least
from ptc.devices import page_out_weights
from ptc.errors import OutputError, VerifyError, library_errors
from ptc.files import file_sha256, write_bytes_atomic, write_json_atomic
from ptc.output_dirs import staged_directory
from ptc.targets.base import Family, OnnxTower, batch_rows

# The reload is checked end to end on a few of the check inputs and prompts (weights, config,
# tokenizer); its preprocessing on all of them. The edited model's own figures are the route's.
RELOAD_CHECKS = 4
# What writes each reduced-precision variant of a tower (export.precision), from its fp32 graph.
REDUCED_PRECISIONS = {"fp16": fp16_variant, "int8": int8_variant}
# The serving contract's tokenizer is checked on the recipe's prompts, at most this many, token
# for token; its text graph on the first few of them and a prompt past the context. A prompt
# tokenised identically then gets the graph's verified output: running the graph on all of
# them was most of a cold build's serving check (a text tower pass per prompt, twice).
SERVING_PROMPTS = 64
SERVING_TEXT_PASSES = 4


@dataclass
class TowerExport:
    """One tower written, run and compared: its figures and the files it added."""

    diff: float
    provider: ProviderRun
    outputs: np.ndarray | None = None  # the fp32 graph's on the check inputs (input tower)
    cosines: dict[str, list[float]] = field(default_factory=dict)  # per reduced precision
    variant_outputs: dict[str, np.ndarray] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    interfaces: dict[str, Interface] = field(default_factory=dict)
    triton_models: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Staging:
    """What every exporter writes with: the checked edit, the staging folder, the provenance
    every written file carries, and the run's timings and counts."""

    edited: EditedModel
    folder: Path
    provenance: dict[str, str]
    run: Run

    @property
    def plan(self) -> Plan:
        return self.edited.plan


@dataclass(frozen=True)
class Written:
    """A build written in place: its report and the lock it wrote."""

    report: BuildReport
    lock: LockDocument


def provenance_of(plan: Plan, target: Target) -> dict[str, str]:
    """What every written graph and checkpoint carries in its metadata."""
    return {
        "ptc_version": __version__,
        "ptc_recipe_sha256": target.lock_inputs["recipe_sha256"],
        "ptc_lock_hash": sha256_of(target.lock_inputs),
        "ptc_base_model": base_model_name(target.model),
        "ptc_route": plan.recipe.route,
    }


def write_output(
    target: Target, edited: EditedModel, checked: CheckedEdit, options: Options, run: Run
) -> Written:
    """Export, verify and write every file into a staging folder, renamed into place when all
    passed. The lock is written last, over every other file's bytes."""
    plan = edited.plan
    if plan.out_dir is None:  # execute refuses an export without one before any stage runs
        raise RuntimeError("write_output needs the plan's output directory")
    try:
        with staged_directory(plan.out_dir, replace=options.force) as folder:
            staging = Staging(edited, folder, provenance_of(plan, target), run)
            exported = export_and_verify(target, staging)
            report = build_report(target, edited, checked, exported)
            _write_files(target, edited, checked, report, folder)
            lock = lock_document(target.lock_inputs, lock_derived(edited, report), _hashes(folder))
            write_json_atomic(folder / LOCK_NAME, lock)
            report.run = run_record(run, plan)
            write_json_atomic(folder / RUN_RECORD, report.run)
    except FileExistsError:
        raise OutputError(
            f"output directory {plan.out_dir} appeared during the build",
            "pass --force to replace it",
        ) from None
    plan.bank.remember_lock(plan.out_dir / LOCK_NAME)  # `ptc bank prune` keeps what it names
    return Written(report, lock)


def _write_files(
    target: Target, edited: EditedModel, checked: CheckedEdit, report: BuildReport, staging: Path
) -> None:
    plan, edit = edited.plan, edited.edit
    write_bytes_atomic(staging / "recipe.yaml", plan.recipe_bytes)
    if edit.term_edits is not None:
        record = terms_file_record(plan, target.model, report.terms)
        write_terms(
            staging / TERMS_FILE,
            edit.term_edits,
            record["terms"],
            record["tasks"],
            record["target"],
        )
    write_json_atomic(staging / "report.json", report.to_json())
    if report.evaluation:
        write_bytes_atomic(staging / PLOT_NAME, evaluation_png(report.evaluation, report.terms))
    contract = read_contract(staging / "onnx") if report.serving_files else None
    card = model_card(target.model, edit.card, report.terms, report.to_json(), contract)
    write_bytes_atomic(staging / "README.md", card.encode("utf-8"))


def _hashes(staging: Path) -> dict[str, str]:
    return {p.relative_to(staging).as_posix(): file_sha256(p) for p in output_files(staging)}


def lock_derived(edited: EditedModel, report: BuildReport) -> dict[str, Any]:
    """The lock's `derived` section: what the build computed that decides the output's bytes."""
    operators = [
        {
            "task": t["task"],
            "source": t["source"],
            "weight": t["weight"],
            "operator_sha256": t["operator_sha256"],
        }
        for t in report.terms
    ]
    return {
        "route": edited.plan.recipe.route,
        **edited.edit.lock,
        "operators": operators,
        "embeddings": report.embeddings,
        **({"base_exports": report.base_exports} if report.base_exports else {}),
    }


def update_recipe_lock(plan: Plan, document: LockDocument) -> dict[str, Any]:
    """The recipe's lock follows its last build: written, or updated with what changed said."""
    path = recipe_lock_path(plan.recipe_path)
    plan.bank.remember_lock(path)  # `ptc bank prune` keeps the exports it names
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
    state = "written" if before is None else "updated"
    return {"path": str(path), "state": state, "changes": changes}


def terms_file_record(plan: Plan, target: Family, terms: list[TermRecord]) -> dict[str, Any]:
    tasks = {
        pt.task.name: {"classes": list(pt.task.classes), "templates": list(pt.task.templates)}
        for pt in plan.terms
    }
    # No path: the file's bytes must not depend on where the output is written. Where the target
    # lies (its ref may be relative to the recipe) is the run's record (`run_record`).
    where = {"ref": plan.recipe.target, "input_fingerprint": target.input_fingerprint()}
    return {"terms": terms, "tasks": tasks, "target": where}


def export_and_verify(target: Target, staging: Staging) -> Exported:
    exported = Exported(written=True)
    formats = staging.plan.recipe.export.formats
    if "onnx" in formats:
        export_onnx_towers(staging, target.model, exported)
    if "safetensors" in formats:  # last: see export_native
        export_native(staging, exported, release=[target.model])
    return exported


def export_native(staging: Staging, exported: Exported, release: list[Family]) -> None:
    """The edited checkpoint in the family's own format, reloaded and compared.

    The reload is the build's last use of model weights, and the reloaded copy is a whole
    model: held beside the target and the edited model (which shares all but the edited
    tensors with it, or none after an adapter merge) it was the build's peak memory, two or
    three models' bytes. So the reference outputs are taken first and the edited model and
    the `release` models let their weights go (to the meta device) before the reload."""
    plan, edit, check, run = staging.plan, staging.edited.edit, staging.edited.check, staging.run
    edited, folder = edit.edited, staging.folder / "model"
    with run.stage("export_native"):
        scheme = edited.save_native(folder)
        stamp_safetensors(folder, staging.provenance)
    with run.stage("verify_reload"):
        prompts = plan.terms[0].task.prompts[:RELOAD_CHECKS]
        expected_prompts = reference_prompts(edited, check.prompts, prompts)
        for model in [edited, *release]:
            model.to_device(torch.device("meta"))
        gc.collect()  # the exporter's graphs reach the old weights through reference cycles
        reloaded = targets.load(f"{scheme}:{folder}")
        batch = reloaded.load_inputs(check.paths)
        if any(not torch.equal(batch[name], check.batch[name]) for name in check.batch):
            raise VerifyError(
                "verification failed: the reloaded checkpoint preprocesses inputs differently",
                "nothing was written; the family's save_native loses part of its processor",
            )
        few = batch_rows(batch, slice(0, RELOAD_CHECKS))
        diff = max(
            max_abs_difference(reloaded.embed_inputs(few), edit.check_outputs[:RELOAD_CHECKS]),
            max_abs_difference(reloaded.embed_prompts(prompts), expected_prompts),
        )
    atol = plan.recipe.verify.equivalence_atol
    exported.reload_max_abs_diff = require("reload_max_abs_diff", diff, atol)
    exported.native_ref = f"{scheme}:model"


def export_onnx_towers(staging: Staging, model: Family, exported: Exported) -> None:
    """Every tower as ONNX (and fp16, and Triton, as the recipe asks), each run and compared."""
    plan, edit, verify = staging.plan, staging.edited.edit, staging.plan.recipe.verify
    # the export cache is one per model, whatever the precision
    weights_key = model_info(model).weights_key
    towers: list[TowerExport] = []
    bases, edited_towers = model.onnx_towers(), edit.edited.onnx_towers()
    for index, (base, tower) in enumerate(zip(bases, edited_towers)):
        path = staging.folder / "onnx" / f"{tower.name}.onnx"
        hint = (
            "nothing was written; the graph or its cached base in the bank is damaged: "
            f"run `ptc bank verify --bank {plan.bank.root}`"
        )
        with library_errors(f"ONNX tower {tower.name}", hint, OutputError):
            idle = [other.module for other in bases if other is not base]
            towers.append(export_onnx_tower(staging, index, base, tower, path, weights_key, idle))
        exported.base_exports[base.name] = export_key(weights_key, base)
    diff = max(t.diff for t in towers)
    exported.onnx_max_abs_diff = require("onnx_max_abs_diff", diff, verify.equivalence_atol)
    provider = towers[-1].provider
    exported.onnx_provider = provider["ran"]
    exported.onnx_provider_requested = provider["requested"]
    exported.onnx_provider_fell_back = provider["fell_back"]
    for t in towers:
        exported.onnx_files += t.files
        exported.onnx_interface.update(t.interfaces)
        exported.triton_models += t.triton_models
    for precision, limit in (("fp16", verify.fp16_min_cosine), ("int8", verify.int8_min_cosine)):
        cosines = [c for t in towers for c in t.cosines.get(precision, [])]
        if cosines:
            name = f"{precision}_min_cosine"
            setattr(exported, name, require_at_least(name, min(cosines), limit))
    first = towers[0]
    if first.outputs is not None and "int8" in first.variant_outputs:
        agreement = top1_agreement(staging, first.outputs, first.variant_outputs["int8"])
        exported.int8_top1_agreement = require_at_least(
            "int8_top1_agreement", agreement, verify.int8_min_top1_agreement
        )
    exported.onnx_bytes = {
        f"onnx/{p.name}": sum(f.stat().st_size for f in onnx_files(p))
        for p in sorted((staging.folder / "onnx").glob("*.onnx"))
    }
    export_serving(staging, edited_towers, exported)


def top1_agreement(staging: Staging, reference: np.ndarray, reduced: np.ndarray) -> float:
    """How often a reduced-precision input tower picks the fp32 tower's zero-shot class on the
    check inputs, with each term's class rows as the build embedded them (an edit leaves the
    text tower as it was, so they are the edited model's)."""
    agreeing, counted = 0, 0
    for name in dict.fromkeys(term.task.name for term in staging.plan.terms):
        rows = staging.edited.grids[name].class_rows.double()
        picks = [
            (normalise(torch.from_numpy(z).double()) @ rows.T).argmax(dim=1)
            for z in (reference, reduced)
        ]
        agreeing += int((picks[0] == picks[1]).sum())
        counted += len(picks[0])
    return agreeing / counted


def export_serving(staging: Staging, towers: list[OnnxTower], exported: Exported) -> None:
    """The serving contract beside the graphs, held to the family: the client's preprocessing
    of the check input files against the batch the graphs were verified on (within two
    intensity levels for a resized image), and its tokenizer and text graph against the edited
    model's prompt embeddings, a prompt past the context included (within the build's
    tolerance). Inputs and prompts the client preprocesses identically get the graph's verified
    output; a prompt it tokenises otherwise fails the build."""
    plan, edit, check, run = staging.plan, staging.edited.edit, staging.edited.check, staging.run
    atol = plan.recipe.verify.equivalence_atol
    folder = staging.folder / "onnx"
    with run.stage("export_serving"):
        spec = edit.edited.serving_spec()
        exported.serving_files = write_contract(spec, towers, folder)
    with run.stage("verify_serving"):
        client = OnnxClient(folder)
        largest, identical = preprocess_difference(client.input_arrays(check.paths), check.batch)
        prompts = sorted({p for term in plan.terms for p in term.task.prompts})[:SERVING_PROMPTS]
        prompts.append(LONG_PROMPT)
        same = token_agreement(client.token_arrays(prompts), edit.edited.prompt_tokens(prompts))
        if not same.all():
            raise VerifyError(
                f"verification failed: serving_prompts_identical = {same.sum()}/{len(prompts)}: "
                f"onnx/{TOKENIZER_FILE} tokenises {prompts[int(np.argmin(same))]!r} otherwise "
                "than the family's tokenizer",
                "nothing was written; the family's serving_spec describes its tokenizer wrongly",
            )
        passes = [*prompts[: min(SERVING_TEXT_PASSES, len(prompts) - 1)], LONG_PROMPT]
        text_diff = max_abs_difference(
            client.embed_texts(passes), reference_prompts(edit.edited, check.prompts, passes)
        )
    exported.serving_prompts_identical = f"{int(same.sum())}/{len(prompts)}"
    exported.serving_preprocess_max_abs_diff = require(
        "serving_preprocess_max_abs_diff",
        largest,
        preprocess_tolerance(spec.preprocessing, atol),
    )
    exported.serving_inputs_identical = f"{identical}/{len(check.paths)}"
    exported.serving_text_max_abs_diff = require("serving_text_max_abs_diff", text_diff, atol)


def reference_prompts(
    model: Family, cached: dict[str, torch.Tensor], prompts: list[str]
) -> torch.Tensor:
    """The model's embeddings of `prompts`: the embed stage's where it holds them (an edit
    leaves the text tower as it was), a pass for the rest."""
    missing = [p for p in prompts if p not in cached]
    computed = dict(zip(missing, model.embed_prompts(missing))) if missing else {}
    return torch.stack([cached[p] if p in cached else computed[p] for p in prompts])


def export_onnx_tower(
    staging: Staging,
    index: int,
    base: OnnxTower,
    tower: OnnxTower,
    path: Path,
    weights_key: str,
    idle: list[torch.nn.Module],
) -> TowerExport:
    """One tower written, run and compared, with its fp16 variant and Triton models as asked;
    `idle`, the model's other towers, paged out if its base is exported afresh."""
    plan, edit, check, run = staging.plan, staging.edited.edit, staging.edited.check, staging.run
    provenance, export = staging.provenance, plan.recipe.export
    if plan.bank.export_problem(export_key(weights_key, base), base.name) is not None:
        with run.stage("export_base"):  # the tower's one-time export, timed apart
            cache_base(plan.bank, weights_key, base, idle)
    with run.stage("export_onnx"):
        fp32 = {**provenance, "ptc_precision": "fp32"}
        how = write_tower(plan.bank, weights_key, base, tower, path, fp32, idle)
        run.counts[f"onnx_towers_{how}"] += 1
    with run.stage("verify_onnx"):
        if index == 0:  # the input tower, on the real check inputs the route already embedded
            inputs, expected = check.batch, edit.check_outputs
        else:
            inputs = tower.example_inputs
            with torch.inference_mode():
                expected = tower.module(**inputs)
        page_out_weights(tower.module)  # idle while the graph runs (ptc/devices.py)
        got, provider = run_onnx(path, inputs)
        result = TowerExport(max_abs_difference(got, expected), provider)
        result.outputs = got if index == 0 else None
    variants = [(tower.name, path)]
    result.files.append(f"onnx/{path.name}")
    result.interfaces[f"onnx/{path.name}"] = interface(path)
    for precision in (p for p in export.precision if p != "fp32"):
        reduced = path.with_name(f"{tower.name}_{precision}.onnx")
        with run.stage(f"export_{precision}"):
            REDUCED_PRECISIONS[precision](path, reduced, provenance)
        with run.stage(f"verify_{precision}"):
            outputs = run_onnx(reduced, inputs)[0]
            result.cosines[precision] = [min_row_cosine(outputs, got)]
            result.variant_outputs[precision] = outputs
        variants.append((reduced.stem, reduced))
        result.files.append(f"onnx/{reduced.name}")
        result.interfaces[f"onnx/{reduced.name}"] = interface(reduced)
    if "triton" in export.formats:
        with run.stage("export_triton"):
            for name, onnx_path in variants:
                repository = path.parent.parent / "triton"
                write_triton_model(repository, name, onnx_path, export.triton.max_batch_size)
                result.triton_models.append(name)
    return result
