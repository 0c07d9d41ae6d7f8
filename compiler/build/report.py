"""The build report: what a build made and how it verified (`report.json`, the same bytes for
the same inputs), with this run's record beside it (`run.json`: timings, memory, cache) and the
summary `ptc build` prints. The build fills it; the CLI prints `summary_lines()`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptc import __version__
from ptc.compiler.build.stages import CheckedEdit, EditedModel, Target
from ptc.compiler.edit.routes import Edit, Run
from ptc.compiler.recipe.lock import sha256_of
from ptc.compiler.recipe.plan import Plan, TermRecord
from ptc.compiler.verify.certify import Certificate
from ptc.compiler.verify.evaluate import HeldOut
from ptc.memory import peak_rss_mb

__all__ = ["peak_rss_mb"]  # benchmarks read a build's peak from here


@dataclass
class Exported:
    """What the exports wrote and measured; all None and empty when nothing was exported."""

    written: bool = False
    onnx_max_abs_diff: float | None = None
    onnx_provider: str | None = None
    onnx_provider_requested: str | None = None
    onnx_provider_fell_back: bool | None = None
    reload_max_abs_diff: float | None = None
    native_ref: str | None = None  # how the native checkpoint reloads ("hf:model")
    fp16_min_cosine: float | None = None
    int8_min_cosine: float | None = None
    int8_top1_agreement: float | None = None
    onnx_bytes: dict[str, int] = field(default_factory=dict)  # each graph with its data file
    serving_preprocess_max_abs_diff: float | None = None
    serving_inputs_identical: str | None = None  # "k/n" check inputs preprocessed identically
    serving_prompts_identical: str | None = None  # "k/n" prompts tokenised identically
    serving_text_max_abs_diff: float | None = None
    serving_files: list[str] = field(default_factory=list)
    triton_models: list[str] = field(default_factory=list)
    onnx_files: list[str] = field(default_factory=list)
    onnx_interface: dict[str, Any] = field(default_factory=dict)
    base_exports: dict[str, str] = field(default_factory=dict)  # tower -> its bank export key

    def figures(self) -> dict[str, Any]:
        """The measured figures, as report.json's verify.equivalence holds them."""
        names = (
            "onnx_max_abs_diff",
            "onnx_provider",
            "onnx_provider_requested",
            "onnx_provider_fell_back",
            "reload_max_abs_diff",
            "fp16_min_cosine",
            "int8_min_cosine",
            "int8_top1_agreement",
            "serving_preprocess_max_abs_diff",
            "serving_inputs_identical",
            "serving_prompts_identical",
            "serving_text_max_abs_diff",
        )
        return {name: getattr(self, name) for name in names}


@dataclass
class BuildReport:
    ptc_version: str
    recipe: str  # the recipe file's name
    route: str
    target: dict[str, Any]  # ref and fingerprints
    native_ref: str | None  # how the native checkpoint reloads ("hf:model"), if written
    embed_dim: int
    terms: list[TermRecord]
    route_report: dict[str, Any]  # what the route adds (the adapter's training; SigLIP's reference)
    verify: dict[str, Any]  # linearity, equivalence, descriptor residuals, tolerances
    strength: dict[str, Any]
    certificate: dict[str, Certificate]
    evaluation: dict[str, HeldOut]  # held-out zero-shot accuracy before and after, per task
    lock_hash: str
    formats: list[str]
    precision: list[str]
    triton_models: list[str]
    onnx_files: list[str]
    onnx_bytes: dict[str, int]  # each graph's size with its data file
    serving_files: list[str]  # the serving contract and its tokenizer, beside the graphs
    onnx_interface: dict[str, Any]  # per graph: its inputs' and outputs' names, dtypes and shapes
    # per grid: the device and precision that made the target's embeddings
    embeddings: dict[str, dict[str, str] | None]
    base_exports: dict[str, str] = field(default_factory=dict)  # the lock's, not report.json's
    run: dict[str, Any] = field(default_factory=dict)  # run.json: cache counts, timings, peak RSS
    recipe_lock: dict[str, Any] | None = None  # what the build did to RECIPE.lock
    out_dir: Path | None = None  # where it was written; None with --no-export

    def to_json(self) -> dict[str, Any]:
        """report.json's content."""
        return {
            "ptc_version": self.ptc_version,
            "recipe": self.recipe,
            "route": self.route,
            "target": self.target,
            "native_ref": self.native_ref,
            "embed_dim": self.embed_dim,
            "terms": self.terms,
            **self.route_report,
            "verify": self.verify,
            "strength": self.strength,
            "certificate": self.certificate,
            "evaluation": self.evaluation,
            "lock_hash": self.lock_hash,
            "formats": self.formats,
            "precision": self.precision,
            "triton_models": self.triton_models,
            "onnx_files": self.onnx_files,
            "onnx_bytes": self.onnx_bytes,
            "serving_files": self.serving_files,
            "onnx_interface": self.onnx_interface,
            "embeddings": self.embeddings,
        }

    def summary_lines(self) -> list[str]:
        """What `ptc build` prints: verification, strengths, certificate, accuracy, where it went."""
        return [
            *self._verification_lines(),
            *self._strength_lines(),
            *self._certificate_lines(),
            *self._evaluation_lines(),
            *self._outcome_lines(),
        ]

    def _verification_lines(self) -> list[str]:
        lin, eq = self.verify["linearity"], self.verify["equivalence"]
        lines = (
            [f"linearity fp64 {lin['max_rel_diff_fp64']:.2e}, fp32 {lin['max_rel_diff_fp32']:.2e}"]
            if lin
            else []
        )
        lines.append(
            f"equivalence torch {eq['torch_max_abs_diff']:.2e}, onnx {_fmt(eq['onnx_max_abs_diff'])}, "
            f"reload {_fmt(eq['reload_max_abs_diff'])}"
        )
        residuals = ", ".join(f"{k} {v:.3f}" for k, v in self.verify["descriptor_residual"].items())
        return [*lines, f"descriptor residual ({self.route}): {residuals}"]

    def _strength_lines(self) -> list[str]:
        if self.strength["mode"] != "auto":
            return []
        chosen = ", ".join(
            f"{w['task']}/{w['source']} {w['chosen']:+.3f}" for w in self.strength["weights"]
        )
        controls = ", ".join(self.strength["control_tasks"]) or "none"
        return [f"strength auto: {chosen} (held-out descriptor fit, control grids: {controls})"]

    def _certificate_lines(self) -> list[str]:
        return [
            f"certificate {task:<12} {f['certified_fraction']:.1%} of {f['inputs']} inputs certified, "
            f"{f['certified_changed']} certified changed ({f['changed']} changed in all)"
            for task, f in self.certificate.items()
        ]

    def _evaluation_lines(self) -> list[str]:
        return [
            f"held-out zero-shot {task:<12} {f['before']:.3f} -> {f['after']:.3f} "
            f"({f['delta_points']:+.1f} points, {f['role']})"
            for task, f in self.evaluation.items()
        ]

    def _outcome_lines(self) -> list[str]:
        where = (
            f"built {self.out_dir}" if self.out_dir else "verified (--no-export: nothing written)"
        )
        lines = [
            f"{where} in {sum(self.run.get('timings', {}).values()):.1f}s (lock {self.lock_hash[:12]})"
        ]
        change = self.recipe_lock
        if change:
            said = {
                "unchanged": "unchanged",
                "written": "written",
                "updated": f"updated, {len(change['changes'])} change(s)",
            }[change["state"]]
            lines += [
                f"lock {change['path']}: {said}",
                *(f"  {line}" for line in change["changes"]),
            ]
        return lines


def _fmt(value: object) -> str:
    return "n/a" if value is None else f"{value:.2e}"


def build_report(
    target: Target, edited: EditedModel, checked: CheckedEdit, exported: Exported
) -> BuildReport:
    """What was built and how it verified: report.json's content, the same for the same inputs."""
    plan, edit, recipe = edited.plan, edited.edit, edited.plan.recipe
    equivalence = {
        "torch_max_abs_diff": edit.torch_max_abs_diff,
        **exported.figures(),
        "check_inputs": len(edited.check.paths),
    }
    verify = {
        "linearity": edit.report["linearity"],
        "equivalence": equivalence,
        "descriptor_residual": checked.residuals,
        "tolerances": recipe.verify.model_dump(),
    }
    return BuildReport(
        ptc_version=__version__,
        recipe=plan.recipe_path.name,
        route=recipe.route,
        target=target.lock_inputs["target"],
        native_ref=exported.native_ref,
        embed_dim=target.model.embed_dim,
        terms=term_records(plan, edit, checked.residuals),
        route_report={k: v for k, v in edit.report.items() if k != "linearity"},
        verify=verify,
        strength=edited.strength or {"mode": "fixed"},
        certificate=checked.certified,
        evaluation=checked.evaluation,
        lock_hash=sha256_of(target.lock_inputs),
        formats=list(recipe.export.formats) if exported.written else [],
        precision=list(recipe.export.precision),
        triton_models=exported.triton_models,
        onnx_files=exported.onnx_files,
        onnx_bytes=exported.onnx_bytes,
        serving_files=exported.serving_files,
        onnx_interface=exported.onnx_interface,
        base_exports=exported.base_exports,
        embeddings={name: emb.made_by for name, emb in edited.grids.items()},
    )


def term_records(plan: Plan, edit: Edit, residuals: dict[str, float]) -> list[TermRecord]:
    """Each term as the report and the lock record it: its sources, weights and hashes."""
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
            "source_weights": pt.resolved.meta.get("source_weights"),
            "grid_hash": pt.task.grid_hash,
            "descriptor_sha256": pt.resolved.sha256,
            "source_descriptor_sha256": [entry.sha256 for entry in pt.sources],
            "operator_sha256": sha,
            "grid_residual": residuals[pt.task.name],
        }
        for pt, sha in zip(plan.terms, edit.term_hashes)
    ]


def run_record(run: Run, plan: Plan) -> dict[str, Any]:
    """How this run went (run.json): what differs from one build of the same inputs to the next,
    and where it found its target's relative reference (for `ptc certify`): the recipe's folder,
    absolute and relative to the output (a tree moved whole still resolves)."""
    run.close_stretch()
    record: dict[str, Any] = {
        "cache": dict(run.counts),
        "timings": dict(run.timings),
        "peak_rss_mb": peak_rss_mb(),
    }
    if run.peaks:  # which stage made the peak (ptc/memory.py; Linux)
        record["peak_rss_mb_by_stage"] = dict(run.peaks)
    if plan.out_dir is not None:
        record["target_base_dir"] = {
            "absolute": str(Path(plan.base_dir).resolve()),
            "from_output": os.path.relpath(plan.base_dir, plan.out_dir),
        }
    return record
