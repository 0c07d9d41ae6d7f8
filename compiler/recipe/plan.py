"""Planning a build: validate the recipe and resolve every term against the bank without
loading a single weight (mergekit's plan half; all that `ptc check` does)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

from ptc import targets
from ptc.compiler.bank.store import Bank, Entry, TaskRecord
from ptc.compiler.embed import check_grid_unchanged
from ptc.compiler.recipe.options import Options
from ptc.compiler.recipe.schema import Recipe, Term, load_recipe
from ptc.errors import BankError, OutputError, PtcError, RecipeError
from ptc.output_dirs import check_output_location, check_replaceable


class TermRecord(TypedDict):
    """A built term as report.json and the model card record it."""

    task: str
    source: str  # its label: the descriptor id, `a+b` for a consensus, "(relative)" marked
    weight: float  # the strength applied
    written_weight: float  # the recipe's
    kind: str
    sources: list[str]
    combine: str | None
    weighting: str | None  # None: one source, or a median
    source_weights: list[float] | None
    grid_hash: str
    descriptor_sha256: str
    source_descriptor_sha256: list[str]
    operator_sha256: str | None  # the closed form's cached operator; None for the adapter
    grid_residual: float


@dataclass(frozen=True)
class PlannedTerm:
    """A recipe term resolved against the bank. `descriptor` is what the solve uses: the one
    source's entry for a plain term; for a consensus or a relative term it depends on the
    target, and terms.resolve_descriptors fills it in once the target's grids are embedded.
    `weight` is the strength the build applies (the recipe's, until `strength: auto` sets it)."""

    term: Term
    task: TaskRecord
    sources: tuple[Entry, ...]
    descriptor: Entry | None
    weight: float

    @property
    def resolved(self) -> Entry:
        """The descriptor the solve uses, once resolve_descriptors has filled it in."""
        if self.descriptor is None:
            raise RuntimeError(f"term {self.term.label}: descriptor read before it was resolved")
        return self.descriptor


@dataclass(frozen=True)
class Plan:
    recipe_path: Path
    recipe: Recipe
    recipe_bytes: bytes
    bank: Bank
    target_location: str
    terms: tuple[PlannedTerm, ...]
    out_dir: Path | None
    evaluations: tuple[tuple[TaskRecord, Path], ...] = ()  # (task, labelled folder)
    controls: tuple[TaskRecord, ...] = ()  # control grids of `strength: auto`
    certifications: tuple[tuple[TaskRecord, Path], ...] = ()  # (task, folder of inputs)

    @property
    def base_dir(self) -> Path:
        return self.recipe_path.parent


def _checked_source(bank: Bank, term: Term, task: TaskRecord, source: str) -> Entry:
    entry = bank.descriptor(term.task, source)
    if entry.meta.get("grid_hash") != task.grid_hash:
        raise BankError(
            f"descriptor {source!r} was computed on another grid of task {term.task!r} "
            f"({str(entry.meta.get('grid_hash'))[:12]} != {task.grid_hash[:12]})",
            "recompute it with `ptc descriptor add`",
        )
    text = entry.meta.get("finetuned_text_fingerprint")
    if text is not None and text != entry.meta.get("text_fingerprint"):
        raise BankError(
            f"descriptor {source!r} of task {term.task!r} comes from a fine-tune whose text "
            "tower differs from its source's; its affinities do not share prompts",
            "recompute it from a fine-tune with a frozen text tower",
        )
    expected = (len(task.probes), len(task.classes))
    readers = [
        why
        for why, reads in (
            ("`kind: relative`", term.kind == "relative"),
            (
                "`source_weights: agreement` (the default for several sources)",
                term.weighting == "agreement",
            ),
        )
        if reads
    ]
    for name in ("utd", "source_affinity") if readers else ("utd",):
        if name not in entry.tensors:
            raise BankError(
                f"descriptor {source!r} of task {term.task!r} has no source affinities, which "
                f"{' and '.join(readers)} reads (it was made by an older ptc)",
                "recompute it with `ptc descriptor add`, or use kind: difference and "
                "source_weights: uniform",
            )
        if tuple(entry.tensors[name].shape) != expected:
            raise BankError(
                f"descriptor {source!r} of task {term.task!r} is "
                f"{tuple(entry.tensors[name].shape)} but the grid is {expected}",
                "recompute it with `ptc descriptor add`",
            )
    return entry


def _plan_term(bank: Bank, term: Term, checked_tasks: dict[str, TaskRecord]) -> PlannedTerm:
    if term.task not in checked_tasks:
        task = bank.task(term.task)
        check_grid_unchanged(task)
        checked_tasks[term.task] = task
    task = checked_tasks[term.task]
    sources = tuple(_checked_source(bank, term, task, source) for source in term.sources)
    plain = len(sources) == 1 and term.kind == "difference"
    return PlannedTerm(term, task, sources, sources[0] if plain else None, term.weight)


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
        raise OutputError(
            f"{recipe_path}: export.out: {written!r} escapes the recipe's folder {base} via '..'",
            "write it inside the recipe's folder, or pass --out",
        )
    resolved = lexical.resolve()
    if not resolved.is_relative_to(base.resolve()):
        raise OutputError(
            f"{recipe_path}: export.out: {written!r} escapes the recipe's folder via a symlink "
            f"(it resolves to {resolved})",
            "pass --out to write there on purpose",
        )
    return resolved


def _output_dir(recipe: Recipe, recipe_path: Path, options: Options, bank: Bank) -> Path | None:
    if options.out is not None:
        out = Path(options.out).expanduser().resolve()
    elif recipe.export.out is not None:
        out = _recipe_output(recipe_path, recipe.export.out)
    else:
        return None
    check_output_location(out, {"the bank": bank.root, "the recipe": recipe_path})
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} exists and is not a directory")
    if options.export and out.is_dir() and any(out.iterdir()):
        if not options.force:
            raise OutputError(
                f"output directory {out} exists and is not empty", "pass --force to replace it"
            )
        check_replaceable(out)  # --force replaces only what ptc wrote there
    return out


def _where(recipe_path: Path, field: tuple) -> str:
    """`FILE:LINE` of a field of a recipe that parsed (read again: only errors need it)."""
    from ptc.strict_yaml import load_yaml

    line = load_yaml(recipe_path, RecipeError)[1](field)
    return f"{recipe_path}:{line}" if line else str(recipe_path)


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
            raise type(exc)(
                f"{_where(recipe_path, ('terms', index))}: terms[{index}]: {exc.message}", exc.hint
            ) from None
    term_tasks = {pt.task.name for pt in planned}
    if recipe.verify.certify and recipe.route != "closed_form":
        raise RecipeError(
            f"{recipe_path}: verify.certify: the certificate needs the closed form's per-term "
            f"edits; route {recipe.route!r} has none",
            "use route: closed_form, or drop verify.certify",
        )
    return Plan(
        recipe_path,
        recipe,
        recipe_path.read_bytes(),
        bank,
        location,
        tuple(planned),
        _output_dir(recipe, recipe_path, options, bank),
        _plan_folders(
            recipe.evaluate,
            "evaluate",
            recipe_path,
            bank,
            "give a labelled folder DIR/<class name>/<files>, relative to the recipe",
        ),
        _plan_controls(recipe, recipe_path, bank, term_tasks),
        _plan_folders(
            recipe.verify.certify,
            "verify.certify",
            recipe_path,
            bank,
            "give a folder of inputs (labels are not needed), relative to the recipe",
            only=term_tasks,
        ),
    )


def _plan_folders(
    folders: dict[str, str],
    field: str,
    recipe_path: Path,
    bank: Bank,
    hint: str,
    only: set[str] | None = None,
) -> tuple[tuple[TaskRecord, Path], ...]:
    """(task, folder) for a recipe block mapping task names to data folders."""
    planned = []
    for name, folder in folders.items():
        where = _where(recipe_path, (field, name))
        if only is not None and name not in only:
            raise RecipeError(
                f"{where}: {field}.{name}: {name!r} is no term's task",
                f"certify one of the recipe's tasks: {', '.join(sorted(only))}",
            )
        try:
            task = bank.task(name)
        except PtcError as exc:
            raise type(exc)(f"{where}: {field}.{name}: {exc.message}", exc.hint) from None
        data = (recipe_path.parent / Path(folder).expanduser()).resolve()
        if not data.is_dir():
            raise RecipeError(f"{where}: {field}.{name}: {data} is not a folder", hint)
        planned.append((task, data))
    return tuple(planned)


def _plan_controls(
    recipe: Recipe, recipe_path: Path, bank: Bank, term_tasks: set[str]
) -> tuple[TaskRecord, ...]:
    """The control grids `strength: auto` bounds: as listed, or every other registered task."""
    if recipe.strength.mode != "auto":
        return ()
    implicit = recipe.strength.control is None
    names = (
        tuple(n for n in bank.task_names() if n not in term_tasks)
        if recipe.strength.control is None
        else recipe.strength.control
    )
    controls = []
    for index, name in enumerate(names):
        field = (
            f"strength.control (bank task {name!r}, taken as no term edits it)"
            if implicit
            else f"strength.control[{index}]"
        )
        where = recipe_path if implicit else _where(recipe_path, ("strength", "control", index))
        if name in term_tasks:
            raise RecipeError(
                f"{where}: {field}: {name!r} is a term's task, not a control",
                "a control grid must come from a task no term edits",
            )
        try:
            task = bank.task(name)
            check_grid_unchanged(task)
        except PtcError as exc:
            raise type(exc)(f"{where}: {field}: {exc.message}", exc.hint) from None
        controls.append(task)
    return tuple(controls)
