"""Bank plans: which targets, sources and tasks a bank should hold, filled by
`ptc bank build PLAN.yaml` in-process or on Ray.

    tasks: [tasks/eurosat.yaml, tasks/dtd.yaml]          # task files, registered if new
    sources:
      - {id: metaclip-l, pre: hf:/models/metaclip-l, finetuned: {eurosat: /ft/eurosat-lora}}
    targets: [hf:/models/clip-l]
    ridge: 1.0                                            # operators are solved at this ridge
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pydantic

from ptc.compiler.bank.store import Bank
from ptc.compiler.sources.bulk import SourceSpec, fill_bank
from ptc.compiler.tasks.grid import NAME_PATTERN, TaskSpec, load_task
from ptc.devices import Compute
from ptc.errors import PlanError
from ptc.strict_yaml import PathText, load_yaml, validate


class _Strict(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid", strict=True, frozen=True)


class PlanSource(_Strict):
    id: str = pydantic.Field(pattern=NAME_PATTERN)
    pre: PathText = pydantic.Field(min_length=1)
    finetuned: dict[str, PathText] = pydantic.Field(min_length=1)


class PlanFile(_Strict):
    tasks: list[PathText] = pydantic.Field(min_length=1)
    sources: list[PlanSource] = pydantic.Field(min_length=1)
    targets: list[PathText] = pydantic.Field(default_factory=list)
    ridge: float = 1.0

    @pydantic.field_validator("ridge", mode="before")
    @classmethod
    def _ridge(cls, value: Any) -> Any:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 < float(value) < float("inf")
        ):
            raise ValueError("expected a positive finite number")
        return float(value)


@dataclass(frozen=True)
class BankPlan:
    path: Path
    tasks: tuple[TaskSpec, ...]
    sources: tuple[SourceSpec, ...]
    targets: tuple[str, ...]
    ridge: float

    @property
    def base_dir(self) -> Path:
        return self.path.parent


def load_plan(path: Path) -> BankPlan:
    path = Path(path).resolve()
    data, locate = load_yaml(path, PlanError)
    plan = validate(PlanFile, data, path, locate, PlanError)
    tasks = tuple(load_task(path.parent / task_file) for task_file in plan.tasks)
    names = {task.name for task in tasks}
    ids = [source.id for source in plan.sources]
    for index, source in enumerate(plan.sources):
        unknown = sorted(set(source.finetuned) - names)
        if unknown:
            raise PlanError(
                f"{path}:{locate(('sources', index, 'finetuned'))}: sources[{index}].finetuned: "
                f"task {unknown[0]!r} is not one of the plan's tasks",
                f"tasks: {', '.join(sorted(names))}",
            )
        if ids.count(source.id) > 1:
            raise PlanError(
                f"{path}:{locate(('sources', index))}: sources[{index}].id: {source.id!r} appears twice",
                "descriptor ids are per source: give each source its own id",
            )
    sources = tuple(
        SourceSpec(s.id, s.pre, dict(sorted(s.finetuned.items()))) for s in plan.sources
    )
    return BankPlan(path, tasks, sources, tuple(plan.targets), plan.ridge)


def check_references(plan: BankPlan) -> None:
    """PlanError, naming the field, for any target, source or fine-tune that does not resolve."""
    from ptc import targets
    from ptc.compiler.sources.descriptor import check_finetuned
    from ptc.errors import PtcError

    checks: list[tuple[str, Callable[[], str]]] = [
        (f"targets[{i}]", partial(targets.check, ref, plan.base_dir))
        for i, ref in enumerate(plan.targets)
    ]
    for i, source in enumerate(plan.sources):
        checks.append((f"sources[{i}].pre", partial(targets.check, source.pre, plan.base_dir)))
        checks += [
            (
                f"sources[{i}].finetuned.{task}",
                partial(check_finetuned, source.pre, finetuned, plan.base_dir),
            )
            for task, finetuned in source.finetuned.items()
        ]
    for field, check in checks:
        try:
            check()
        except PtcError as exc:
            raise PlanError(f"{plan.path}: {field}: {exc.message}", exc.hint) from None


def run_plan(
    plan: BankPlan,
    bank: Bank,
    ray_address: str | None = None,
    replace: bool = False,
    batch_size: int = 64,
    progress: bool = True,
    compute: Compute = Compute(),
) -> Counter:
    """Register the plan's tasks, then compute everything the bank is missing. Every model the
    plan names is resolved first: a plan that cannot run writes nothing."""
    check_references(plan)
    counts: Counter = Counter()
    for task in plan.tasks:
        counts["tasks_registered"] += bank.add_task(task, replace=replace)[1]
    if ray_address is None:
        counts.update(
            fill_bank(
                bank,
                list(plan.sources),
                list(plan.targets),
                plan.ridge,
                plan.base_dir,
                batch_size,
                progress,
                compute,
            )
        )
    else:
        from ptc.compiler.sources.bulk_ray import fill_bank_on_ray

        counts.update(
            fill_bank_on_ray(
                bank,
                list(plan.sources),
                list(plan.targets),
                plan.ridge,
                plan.base_dir,
                batch_size,
                progress,
                ray_address,
                compute,
            )
        )
    return counts
