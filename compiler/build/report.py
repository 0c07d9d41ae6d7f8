"""The build report: what a build made and how it verified (`report.json`, the same bytes for
the same inputs), with this run's record beside it (`run.json`: timings, memory, cache) and the
summary `ptc build` prints. The build fills it; the CLI prints `summary_lines()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class BuildReport:
    ptc_version: str
    recipe: str  # the recipe file's name
    route: str
    target: dict  # ref and fingerprints
    native_ref: str | None  # how the native checkpoint reloads ("hf:model"), if written
    embed_dim: int
    terms: list[dict]  # each term: task, source(s), weights, hashes, residual
    route_report: dict  # what the route adds (the adapter's training; SigLIP's reference)
    verify: dict  # linearity, equivalence, descriptor residuals, tolerances
    strength: dict
    certificate: dict
    evaluation: dict  # held-out zero-shot accuracy before and after, per task
    lock_hash: str
    formats: list[str]
    precision: list[str]
    triton_models: list[str]
    onnx_files: list[str]
    onnx_interface: dict  # per graph: its inputs' and outputs' names, dtypes and shapes
    embeddings: dict  # per grid: the device and precision that made the target's embeddings
    run: dict = field(default_factory=dict)  # run.json: cache counts, timings, peak RSS
    recipe_lock: dict | None = None  # what the build did to RECIPE.lock
    out_dir: Path | None = None  # where it was written; None with --no-export

    def to_json(self) -> dict:
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


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.2e}"
