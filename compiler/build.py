"""The pipeline a recipe runs through, in two halves (mergekit's plan / execute split):

- `plan` validates the recipe and resolves every term against the bank without loading a
  single weight: this is all `ptc check` does;
- `execute` loads the target, embeds each grid once (cached), solves what is missing
  (cached), sums A = sum w_l A_l, folds it, verifies, and exports into a staging folder that
  is renamed into place only when every check passed.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

import targets

from . import __version__
from .bank import Bank, Entry, TaskRecord
from .adapter import GridGoal, fit_adapter
from .descriptor import affinity
from .embed import GridEmbeddings, check_grid_unchanged, embed_grid, embed_probe_files, model_key
from .errors import BankError, OutputError, PtcError
from .export import (export_onnx, fp16_variant, lock_record, min_row_cosine, model_card, output_hashes, run_onnx,
                     stamp_onnx, stamp_safetensors, write_triton_model)
from .fsio import staged_directory, write_bytes_atomic, write_json_atomic
from .hashing import tensors_sha256
from .lora import default_device
from .operators import ensure_factors, ensure_operator
from .options import Options
from .recipe import Recipe, Term, load_recipe
from .solve import GridFactors
from .verify import (descriptor_residual, embedding_equivalence, linearity, max_abs_difference, require,
                     require_at_least)


@dataclass(frozen=True)
class PlannedTerm:
    term: Term
    task: TaskRecord
    descriptor: Entry


@dataclass(frozen=True)
class Plan:
    recipe_path: Path
    recipe: Recipe
    recipe_bytes: bytes
    bank: Bank
    target_location: str
    terms: tuple[PlannedTerm, ...]
    out_dir: Path | None

    @property
    def base_dir(self) -> Path:
        return self.recipe_path.parent


# -- plan ---------------------------------------------------------------------------------------
def _plan_term(bank: Bank, term: Term, checked_tasks: dict[str, TaskRecord]) -> PlannedTerm:
    if term.task not in checked_tasks:
        task = bank.task(term.task)
        check_grid_unchanged(task)
        checked_tasks[term.task] = task
    task = checked_tasks[term.task]
    entry = bank.descriptor(term.task, term.source)
    if entry.meta.get("grid_hash") != task.grid_hash:
        raise BankError(f"descriptor {term.source!r} was computed on another grid of task {term.task!r} "
                        f"({str(entry.meta.get('grid_hash'))[:12]} != {task.grid_hash[:12]})",
                        "recompute it with `ptc descriptor add`")
    text = entry.meta.get("finetuned_text_fingerprint")
    if text is not None and text != entry.meta.get("text_fingerprint"):
        raise BankError(f"descriptor {term.source!r} of task {term.task!r} comes from a fine-tune whose text "
                        "tower differs from its source's; its affinities do not share prompts",
                        "recompute it from a fine-tune with a frozen text tower")
    expected = (len(task.probes), len(task.classes))
    if tuple(entry.tensors["utd"].shape) != expected:
        raise BankError(f"descriptor {term.source!r} of task {term.task!r} is "
                        f"{tuple(entry.tensors['utd'].shape)} but the grid is {expected}",
                        "recompute it with `ptc descriptor add`")
    return PlannedTerm(term, task, entry)


def _recipe_output(recipe_path: Path, written: str) -> Path:
    """export.out as the recipe names it: a relative path must stay inside the recipe's
    folder, neither climbing out with '..' nor through a symlink (--out is the way to
    write elsewhere)."""
    base = recipe_path.parent
    relative = Path(written).expanduser()
    if relative.is_absolute():
        return relative.resolve()
    lexical = Path(os.path.normpath(base / relative))
    if not lexical.is_relative_to(base):
        raise OutputError(f"{recipe_path}: export.out: {written!r} escapes the recipe's folder {base} via '..'",
                          "write it inside the recipe's folder, or pass --out")
    resolved = lexical.resolve()
    if not resolved.is_relative_to(base.resolve()):
        raise OutputError(f"{recipe_path}: export.out: {written!r} escapes the recipe's folder via a symlink "
                          f"(it resolves to {resolved})", "pass --out to write there on purpose")
    return resolved


def _output_dir(recipe: Recipe, recipe_path: Path, options: Options) -> Path | None:
    if options.out is not None:
        out = Path(options.out).expanduser().resolve()
    elif recipe.export.out is not None:
        out = _recipe_output(recipe_path, recipe.export.out)
    else:
        return None
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} exists and is not a directory")
    if options.export and out.is_dir() and any(out.iterdir()) and not options.force:
        raise OutputError(f"output directory {out} exists and is not empty", "pass --force to replace it")
    return out


def plan(recipe_path: Path, options: Options = Options()) -> Plan:
    recipe_path = Path(recipe_path).resolve()
    recipe = load_recipe(recipe_path)
    base = recipe_path.parent
    bank = options.open_bank((base / recipe.bank) if recipe.bank else None)
    try:
        location = targets.check(recipe.target, base)
    except PtcError as exc:
        raise type(exc)(f"{recipe_path}: target: {exc.message}", exc.hint) from None
    checked: dict[str, TaskRecord] = {}
    planned = []
    for index, term in enumerate(recipe.terms):
        try:
            planned.append(_plan_term(bank, term, checked))
        except PtcError as exc:
            raise type(exc)(f"{recipe_path}: terms[{index}]: {exc.message}", exc.hint) from None
    return Plan(recipe_path, recipe, recipe_path.read_bytes(), bank, location, tuple(planned),
                _output_dir(recipe, recipe_path, options))


# -- execute ------------------------------------------------------------------------------------
@dataclass
class _Run:
    """Mutable bookkeeping of one execution: stage timings and cache counters."""

    timings: dict[str, float] = field(default_factory=dict)
    counts: Counter = field(default_factory=lambda: Counter(embeddings_computed=0, factors_computed=0,
                                                            operators_solved=0))

    @contextmanager
    def stage(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[name] = self.timings.get(name, 0.0) + time.perf_counter() - start


def _check_paths(plan_: Plan, count: int) -> list[Path]:
    """Probe files spread evenly over the recipe's grids, `count` in all."""
    grids = list({pt.task.name: pt.task.probes for pt in plan_.terms}.values())
    per_grid = max(1, count // len(grids))
    picked: list[Path] = []
    for probes in grids:
        step = max(1, len(probes) // per_grid)
        picked.extend(probes[::step][:per_grid])
    return picked[:max(count, len(grids))]


def _grid_goals(plan_: Plan, grids: dict[str, GridEmbeddings]) -> dict[str, torch.Tensor]:
    """sum_l w_l U_l per grid (float64): what the edit should do to each grid's affinities."""
    goals: dict[str, torch.Tensor] = {}
    for pt in plan_.terms:
        scaled = pt.term.weight * pt.descriptor.tensors["utd"].double()
        goals[pt.task.name] = goals[pt.task.name] + scaled if pt.task.name in goals else scaled
    return goals


def _linearity(plan_: Plan, factors: dict[str, GridFactors], ridge: float) -> dict:
    """Per task grid: the term's descriptor plus up to two more of that task from the bank."""
    per_task = {}
    for name, grid_factors in factors.items():
        ids = [pt.term.source for pt in plan_.terms if pt.task.name == name]
        ids += [i for i in plan_.bank.descriptor_ids(name) if i not in ids]
        descriptors = [plan_.bank.descriptor(name, i).tensors["utd"] for i in ids[:3]]
        per_task[name] = linearity(grid_factors, descriptors, ridge)
    return {"max_rel_diff_fp64": max(v["max_rel_diff_fp64"] for v in per_task.values()),
            "max_rel_diff_fp32": max(v["max_rel_diff_fp32"] for v in per_task.values()),
            "per_task": per_task}


@dataclass
class _Edit:
    """What a route hands back: the edited model, its embeddings of every grid's probes,
    its torch-level equivalence figure and whatever it adds to report, lock and terms."""

    edited: object
    grid_inputs: dict[str, torch.Tensor]
    torch_max_abs_diff: float
    report: dict
    lock: dict
    term_hashes: list[str | None]
    card: str


def _closed_form(plan_: Plan, target, target_key: str, grids: dict[str, GridEmbeddings],
                 check_batch: torch.Tensor, run: _Run, options: Options) -> _Edit:
    recipe, ridge = plan_.recipe, plan_.recipe.solve.ridge
    with run.stage("factorize"):
        factors = {name: ensure_factors(plan_.bank, target_key, target, plan_.bank.task(name), emb, run.counts)
                   for name, emb in grids.items()}
    with run.stage("solve"):
        operators = [ensure_operator(plan_.bank, target_key, target, pt.task, pt.descriptor,
                                     factors[pt.task.name], ridge, run.counts) for pt in plan_.terms]
        edit = sum(pt.term.weight * op.tensors["operator"].double() for pt, op in zip(plan_.terms, operators))
    with run.stage("verify_linearity"):
        lin = _linearity(plan_, factors, ridge)
        require("linearity max_rel_diff_fp64", lin["max_rel_diff_fp64"], recipe.verify.linearity_rtol_fp64)
        require("linearity max_rel_diff_fp32", lin["max_rel_diff_fp32"], recipe.verify.linearity_rtol)
    with run.stage("fold"):
        edited = target.with_edit(edit)
    with run.stage("verify_torch"):
        diff = embedding_equivalence(target.embed_inputs(check_batch), edited.embed_inputs(check_batch), edit)
        require("torch_max_abs_diff (edited vs (I + A) z)", diff, recipe.verify.equivalence_atol)
    # The fold is exact (just checked), so the edited grid embeddings follow from the cache.
    identity = torch.eye(edit.shape[0], dtype=torch.float64)
    grid_inputs = {name: emb.inputs.double() @ (identity + edit).T for name, emb in grids.items()}
    return _Edit(edited, grid_inputs, diff, {"linearity": lin, "operator_norm": float(edit.norm())},
                 {"solve": {"ridge": ridge}}, [op.sha256 for op in operators],
                 "The image embedding is `(I + A) z`, with `A` the signed sum of the closed-form operators "
                 "below, folded into the last affine layer")


def _adapter(plan_: Plan, target, target_key: str, grids: dict[str, GridEmbeddings],
             check_batch: torch.Tensor, run: _Run, options: Options) -> _Edit:
    cfg, device = plan_.recipe.adapter, default_device()
    goals = _grid_goals(plan_, grids)
    with run.stage("adapter_inputs"):
        grid_goals = []
        for name, emb in grids.items():
            task = plan_.bank.task(name)
            grid_goals.append(GridGoal(name, target.load_inputs(list(task.probes)).to(device),
                                       emb.class_rows.float().to(device),
                                       affinity(emb.inputs.double(), emb.class_rows).float().to(device),
                                       goals[name].float().to(device)))
    with tempfile.TemporaryDirectory(prefix="ptc-adapter-") as folder, run.stage("adapter_train"):
        module, stats = fit_adapter(target, grid_goals, Path(folder), rank=cfg.rank, alpha=cfg.alpha,
                                    epochs=cfg.epochs, max_steps=cfg.max_steps, lr=cfg.lr,
                                    batch_size=cfg.batch_size, seed=cfg.seed, device=device,
                                    progress=options.progress)
        adapter_sha = tensors_sha256(load_file(Path(folder) / "adapter_model.safetensors"))
        edited = target.with_adapter(Path(folder))  # merged: no LoRA modules are exported
    with run.stage("verify_torch"):
        with torch.no_grad():
            unmerged = target.embed_with(module.cpu(), check_batch)
        diff = max_abs_difference(edited.embed_inputs(check_batch), unmerged)
        require("torch_max_abs_diff (merged vs unmerged adapter)", diff, plan_.recipe.verify.equivalence_atol)
    with run.stage("embed_edited"):
        grid_inputs = {name: embed_probe_files(edited, list(plan_.bank.task(name).probes), options.batch_size,
                                               f"edited {name}", options.progress) for name in grids}
    return _Edit(edited, grid_inputs, diff, {"adapter": stats, "linearity": None},
                 {"adapter": {**cfg.model_dump(), "sha256": adapter_sha}}, [None] * len(plan_.terms),
                 f"A rank-{cfg.rank} LoRA on the input tower's attention q/v projections, fitted to the "
                 "signed sum of the descriptors below and merged into the weights")


ROUTES = {"closed_form": _closed_form, "adapter": _adapter}


def _residuals(plan_: Plan, grids: dict[str, GridEmbeddings], edit: _Edit) -> dict[str, float]:
    goals = _grid_goals(plan_, grids)
    return {name: descriptor_residual(edit.grid_inputs[name], emb.inputs, emb.class_rows, goals[name])
            for name, emb in grids.items()}


def _export_native(plan_: Plan, edited, check_batch, check_paths, staging: Path, provenance: dict,
                   run: _Run) -> dict:
    with run.stage("export_native"):
        scheme = edited.save_native(staging / "model")
        stamp_safetensors(staging / "model", provenance)
    with run.stage("verify_reload"):
        reloaded = targets.load(f"{scheme}:{staging / 'model'}")
        prompts = plan_.terms[0].task.prompts
        diff = max(max_abs_difference(reloaded.embed_inputs(reloaded.load_inputs(check_paths)),
                                      edited.embed_inputs(check_batch)),
                   max_abs_difference(reloaded.embed_prompts(prompts), edited.embed_prompts(prompts)))
    return {"reload_max_abs_diff": require("reload_max_abs_diff", diff, plan_.recipe.verify.equivalence_atol),
            "native_ref": f"{scheme}:model"}


def _export_onnx_towers(plan_: Plan, edited, check_batch, staging: Path, provenance: dict, run: _Run) -> dict:
    export, verify = plan_.recipe.export, plan_.recipe.verify
    diffs, cosines, triton_models, files, provider = [], [], [], [], None
    for index, tower in enumerate(edited.onnx_towers()):
        path = staging / "onnx" / f"{tower.name}.onnx"
        with run.stage("export_onnx"):
            export_onnx(tower, path)
            stamp_onnx(path, {**provenance, "ptc_precision": "fp32"})
        # The input tower (first) is checked on real probes, the others on their examples.
        inputs = {next(iter(tower.example_inputs)): check_batch} if index == 0 else tower.example_inputs
        with run.stage("verify_onnx"):
            got, provider = run_onnx(path, inputs)
            with torch.inference_mode():
                diffs.append(max_abs_difference(got, tower.module(**inputs)))
        variants = [(tower.name, path)]
        files.append(f"onnx/{path.name}")
        if "fp16" in export.precision:
            half = path.with_name(f"{tower.name}_fp16.onnx")
            with run.stage("export_fp16"):
                fp16_variant(path, half, provenance)
            with run.stage("verify_fp16"):
                cosines.append(min_row_cosine(run_onnx(half, inputs)[0], got))
            variants.append((f"{tower.name}_fp16", half))
            files.append(f"onnx/{half.name}")
        if "triton" in export.formats:
            with run.stage("export_triton"):
                for name, onnx_path in variants:
                    write_triton_model(staging / "triton", name, onnx_path, export.triton.max_batch_size)
                    triton_models.append(name)
    figures = {"onnx_max_abs_diff": require("onnx_max_abs_diff", max(diffs), verify.equivalence_atol),
               "onnx_provider": provider["ran"], "onnx_provider_requested": provider["requested"],
               "onnx_provider_fell_back": provider["fell_back"], "fp16_min_cosine": None,
               "triton_models": triton_models, "onnx_files": files}
    if cosines:
        figures["fp16_min_cosine"] = require_at_least("fp16_min_cosine", min(cosines), verify.fp16_min_cosine)
    return figures


def _export_and_verify(plan_: Plan, edited, check_batch: torch.Tensor, check_paths: list[Path],
                       staging: Path, provenance: dict, run: _Run) -> dict:
    figures = dict(NOT_EXPORTED)
    if "safetensors" in plan_.recipe.export.formats:
        figures.update(_export_native(plan_, edited, check_batch, check_paths, staging, provenance, run))
    if "onnx" in plan_.recipe.export.formats:
        figures.update(_export_onnx_towers(plan_, edited, check_batch, staging, provenance, run))
    return figures


def _term_records(plan_: Plan, edit: _Edit, residuals: dict[str, float]) -> list[dict]:
    return [{"task": pt.term.task, "source": pt.term.source, "weight": pt.term.weight,
             "grid_hash": pt.task.grid_hash, "descriptor_sha256": pt.descriptor.sha256,
             "operator_sha256": sha, "grid_residual": residuals[pt.task.name]}
            for pt, sha in zip(plan_.terms, edit.term_hashes)]


def _embed_grids(plan_: Plan, target, options: Options, run: _Run) -> dict[str, GridEmbeddings]:
    grids: dict[str, GridEmbeddings] = {}
    for pt in plan_.terms:
        if pt.task.name not in grids:
            with run.stage("embed"):
                grids[pt.task.name] = embed_grid(target, pt.task, plan_.bank, options.batch_size, options.progress)
                run.counts["embeddings_computed"] += grids[pt.task.name].computed
    return grids


def execute(plan_: Plan, options: Options = Options()) -> dict:
    if plan_.out_dir is None and options.export:
        raise OutputError(f"{plan_.recipe_path}: export.out: no output directory",
                          "set export.out in the recipe or pass --out")
    recipe, run = plan_.recipe, _Run()
    with run.stage("load"):
        target = targets.load(recipe.target, plan_.base_dir)
        target_key = model_key(target)
    grids = _embed_grids(plan_, target, options, run)
    check_paths = _check_paths(plan_, recipe.verify.check_inputs)
    check_batch = target.load_inputs(check_paths)
    edit = ROUTES[recipe.route](plan_, target, target_key, grids, check_batch, run, options)
    with run.stage("verify_residual"):
        residuals = _residuals(plan_, grids, edit)
        if recipe.verify.max_descriptor_residual is not None:
            require("descriptor residual", max(residuals.values()), recipe.verify.max_descriptor_residual)
    terms = _term_records(plan_, edit, residuals)
    target_record = {"ref": recipe.target, "input_fingerprint": target.input_fingerprint(),
                     "text_fingerprint": target.text_fingerprint()}
    lock = lock_record(target_record, terms, {"route": recipe.route, **edit.lock},
                       hashlib.sha256(plan_.recipe_bytes).hexdigest(), recipe.export.model_dump(exclude={"out"}))
    context = (plan_, target, edit, residuals, terms, target_record, lock, check_paths, run)
    if not options.export:  # verified up to the exports; nothing is written
        return _report(*context, NOT_EXPORTED)
    try:
        with staged_directory(plan_.out_dir, replace=options.force) as staging:
            provenance = {"ptc_version": __version__, "ptc_recipe_sha256": lock["recipe_sha256"],
                          "ptc_lock_hash": lock["lock_hash"], "ptc_base_model": recipe.target,
                          "ptc_route": recipe.route}
            exported = _export_and_verify(plan_, edit.edited, check_batch, check_paths, staging, provenance, run)
            report = _report(*context, exported)
            write_bytes_atomic(staging / "recipe.yaml", plan_.recipe_bytes)
            write_json_atomic(staging / "ptc.lock", {**lock, "outputs": output_hashes(staging)})
            write_json_atomic(staging / "report.json", report)
            (staging / "README.md").write_text(model_card(target, recipe.target, edit.card, terms, report))
    except FileExistsError:
        raise OutputError(f"output directory {plan_.out_dir} appeared during the build",
                          "pass --force to replace it") from None
    return report


NOT_EXPORTED = {"onnx_max_abs_diff": None, "onnx_provider": None, "onnx_provider_requested": None,
                "onnx_provider_fell_back": None, "reload_max_abs_diff": None, "native_ref": None,
                "fp16_min_cosine": None, "triton_models": [], "onnx_files": []}


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _report(plan_: Plan, target, edit: _Edit, residuals, terms, target_record, lock, check_paths,
            run: _Run, exported: dict) -> dict:
    recipe = plan_.recipe
    verify = {"linearity": edit.report["linearity"],
              "equivalence": {"torch_max_abs_diff": edit.torch_max_abs_diff,
                              **{k: v for k, v in exported.items()
                                 if k not in ("native_ref", "triton_models", "onnx_files")},
                              "check_inputs": len(check_paths)},
              "descriptor_residual": residuals, "tolerances": recipe.verify.model_dump()}
    return {"ptc_version": __version__, "recipe": str(plan_.recipe_path), "route": recipe.route,
            "target": target_record, "native_ref": exported["native_ref"], "embed_dim": target.embed_dim,
            "terms": terms, **{k: v for k, v in edit.report.items() if k != "linearity"},
            "verify": verify, "cache": dict(run.counts), "timings": dict(run.timings),
            "peak_rss_mb": _peak_rss_mb(), "lock_hash": lock["lock_hash"],
            "formats": list(recipe.export.formats) if exported is not NOT_EXPORTED else [],
            "precision": list(recipe.export.precision), "triton_models": exported["triton_models"],
            "onnx_files": exported["onnx_files"]}
