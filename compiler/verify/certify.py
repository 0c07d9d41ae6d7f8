"""The composition certificate: which predictions of a composed model are
guaranteed to be those of the model edited by one task's terms alone, without labels.

For an input x, task T's single-task model (target + T's terms) embeds f_T(x) (normalised)
with class scores s_j = g_j . f_T(x) and top class t; the other terms move the normalised
embedding by delta(x) = f(x) - f_T(x). For every class j,

    s'_t - s'_j = (s_t - s_j) + (g_t - g_j) . delta(x) >= (s_t - s_j) - ||g_t - g_j|| ||delta(x)||,

so the composed prediction stays t whenever the margin s_t - max_{j != t} s_j exceeds
max_j ||g_t - g_j|| * ||delta(x)||. Such an input is certified. The check that no certified
prediction changes is a soundness check of this code; a build fails if one does.

A certificate needs each term's edit: closed-form builds write them to terms.safetensors.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

import safetensors.torch
import torch

from ptc import targets
from ptc.compiler.embed import embed_probe_files_for_edit
from ptc.compiler.method.descriptor import class_embeddings, normalise, summed
from ptc.compiler.method.ridge import edited_embeddings
from ptc.compiler.recipe.lock import RUN_RECORD
from ptc.compiler.tasks.grid import PROBE_SUFFIXES, TaskSpec, probe_files
from ptc.devices import Compute, autocast
from ptc.errors import OutputError, PtcError, RecipeError
from ptc.files import file_sha256, read_json_file, write_bytes_atomic

TERMS_FILE = "terms.safetensors"
# A certified margin must clear the bound by this much: float64 rounding of the scores is
# ~1e-15, so nothing that rounding could flip is counted as certified.
SAFETY = 1e-9


class Certificate(TypedDict):
    """One task's composition certificate over a folder of inputs."""

    inputs: int
    certified: int
    certified_fraction: float
    changed: int
    certified_changed: int  # a build fails unless this is 0
    median_margin: float
    median_bound: float


def certificate(
    inputs: torch.Tensor,
    regressors: torch.Tensor | None,
    class_rows: torch.Tensor,
    task_edit: torch.Tensor,
    full_edit: torch.Tensor,
) -> Certificate:
    """Certified fraction and changes for one task, from the unedited target's (z, R)."""
    rows = class_rows.double()
    single = normalise(edited_embeddings(inputs, regressors, task_edit))
    composed = normalise(edited_embeddings(inputs, regressors, full_edit))
    scores = single @ rows.T
    top2 = scores.topk(2, dim=1)
    top = top2.indices[:, 0]
    margin = top2.values[:, 0] - top2.values[:, 1]
    spread = torch.cdist(rows, rows)[top].max(dim=1).values  # max_j ||g_top - g_j||
    bound = spread * (composed - single).norm(dim=1)
    certified = margin > bound + SAFETY
    changed = (composed @ rows.T).argmax(dim=1) != top
    n = int(inputs.shape[0])
    return {
        "inputs": n,
        "certified": int(certified.sum()),
        "certified_fraction": float(certified.double().mean()),
        "changed": int(changed.sum()),
        "certified_changed": int((certified & changed).sum()),
        "median_margin": float(margin.median()),
        "median_bound": float(bound.median()),
    }


def task_edits(terms: list[dict[str, Any]], edits: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per task: the sum of its terms' signed edits."""
    per_task: dict[str, torch.Tensor] = {}
    for term, edit in zip(terms, edits):
        per_task[term["task"]] = per_task.get(term["task"], 0) + edit.double()
    return per_task


def write_terms(
    path: Path,
    edits: list[torch.Tensor],
    terms: list[dict[str, Any]],
    tasks: dict[str, dict[str, Any]],
    target: dict[str, Any],
) -> None:
    """The per-term signed edits w_l A_l (float64) and what certify needs to rebuild the rest."""
    tensors = {f"term_{i}": e.double().contiguous() for i, e in enumerate(edits)}
    record = {
        "terms": [{k: t[k] for k in ("task", "source", "weight")} for t in terms],
        "tasks": tasks,
        "target": target,
    }
    write_bytes_atomic(
        path, safetensors.torch.save(tensors, metadata={"ptc": json.dumps(record, sort_keys=True)})
    )


def read_terms(out_dir: Path) -> tuple[dict[str, Any], list[torch.Tensor]]:
    path = Path(out_dir) / TERMS_FILE
    if not path.is_file():
        raise OutputError(
            f"{out_dir}: no {TERMS_FILE}",
            "the certificate needs per-term edits, which closed-form builds write; "
            "rebuild with route: closed_form",
        )
    lock = Path(out_dir) / "ptc.lock"
    if lock.is_file():  # the lock hashes every output: a changed terms file must not be trusted
        outputs = read_json_file(lock, "lock")
        recorded = outputs.get("outputs", {}).get(TERMS_FILE) if isinstance(outputs, dict) else None
        if not isinstance(outputs, dict) or not isinstance(outputs.get("outputs", {}), dict):
            raise OutputError(f"{lock}: not a ptc lock", "the output folder is damaged; rebuild it")
        if recorded is not None and recorded != file_sha256(path):
            raise OutputError(
                f"{path} does not match the hash in {lock}", "the output was modified; rebuild it"
            )
    try:
        with safetensors.safe_open(str(path), "pt") as handle:
            record = json.loads(handle.metadata()["ptc"])
            edits = [handle.get_tensor(f"term_{i}") for i in range(len(record["terms"]))]
    except Exception as exc:  # any parse failure: the file is not what the build wrote
        raise OutputError(
            f"{path}: cannot read the per-term edits: {exc}".split("\n")[0],
            "the output folder is damaged; rebuild it",
        ) from None
    return record, edits


def input_files(folder: Path) -> list[Path]:
    files = probe_files(folder)
    if not files:
        raise RecipeError(
            f"{folder}: no input files", f"supported suffixes: {' '.join(sorted(PROBE_SUFFIXES))}"
        )
    return files


def _target_base_dir(out_dir: Path, where: dict[str, Any]) -> Path:
    """The folder the build resolved its target's reference from: run.json's record, relative to
    the output first (the tree moved whole), then absolute; older outputs kept it in the terms
    record (relative to the output, or absolute)."""
    try:
        recorded = (
            json.loads((out_dir / RUN_RECORD).read_text(encoding="utf-8")).get("target_base_dir")
            or {}
        )
    except (OSError, ValueError, AttributeError):
        recorded = {}
    candidates = [
        out_dir / str(recorded[key]) for key in ("from_output", "absolute") if key in recorded
    ]
    candidates += [out_dir / str(where["base_dir"])] if "base_dir" in where else []
    for folder in candidates:
        try:
            targets.check(where["ref"], folder)
            return folder
        except PtcError:
            continue
    return candidates[0] if candidates else out_dir


def certify_output(
    out_dir: Path,
    data: Path,
    task: str | None = None,
    batch_size: int = 64,
    progress: bool = True,
    compute: Compute = Compute(),
) -> dict[str, Any]:
    """`ptc certify OUT --data DIR`: the certificate of a built output on a folder of inputs."""
    out_dir = Path(out_dir)
    record, edits = read_terms(out_dir)
    tasks = list(record["tasks"])
    if task is None:
        if len(tasks) != 1:
            raise RecipeError(
                f"{out_dir} edits {len(tasks)} tasks ({', '.join(tasks)})", "name one with --task"
            )
        task = tasks[0]
    if task not in record["tasks"]:
        raise RecipeError(
            f"{out_dir}: task {task!r} is no term's", f"certify one of: {', '.join(tasks)}"
        )
    spec, where = record["tasks"][task], record["target"]
    try:
        target = targets.load(where["ref"], _target_base_dir(out_dir, where))
    except PtcError as exc:
        raise type(exc)(
            f"{out_dir}: the build's target {where['ref']}: {exc.message}",
            "certify runs from the unedited target; it must still be where the build found it",
        ) from None
    if target.input_fingerprint() != where["input_fingerprint"]:
        raise OutputError(
            f"{out_dir}: the target {where['ref']} changed since the build "
            f"(input hash {target.input_fingerprint()[:12]} != {where['input_fingerprint'][:12]})",
            "rebuild the output against the current target",
        )
    compute.place(target)
    prompts = TaskSpec(task, (), tuple(spec["classes"]), tuple(spec["templates"])).prompts
    with autocast(target):
        rows = class_embeddings(target.embed_prompts(prompts).double(), len(spec["classes"]))
    z, r = embed_probe_files_for_edit(
        target, input_files(data), batch_size, f"certify {task}", progress
    )
    figures = certificate(
        z, r, rows, task_edits(record["terms"], edits)[task], summed(e.double() for e in edits)
    )
    return {"task": task, "data": str(Path(data).resolve()), **figures}
