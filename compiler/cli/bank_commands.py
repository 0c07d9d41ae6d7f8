"""`ptc task`, `ptc descriptor`, `ptc finetune` and `ptc bank`: what fills and inspects a bank."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import click

from ptc.compiler.cli.app import JSON_FLAG, compute_of, handled, main, open_bank_at, options
from ptc.compiler.cli.flags import flag


# -- tasks ----------------------------------------------------------------------------------------
@main.group()
def task() -> None:
    """Register and list task grids."""


@task.command("add")
@click.argument("task_file", type=click.Path(path_type=Path))
@options("bank")
@flag("--replace", is_flag=True)
@handled
def task_add(task_file: Path, bank: Path | None, replace: bool) -> None:
    """Register TASK_FILE (name, probes, classes, templates) in the bank."""
    from ptc.compiler.tasks.grid import load_task

    store = open_bank_at(bank)
    record, changed = store.add_task(load_task(task_file), replace=replace)
    state = "registered" if changed else "already registered (unchanged)"
    click.echo(
        f"task {record.name}: {state}; {len(record.probes)} probes x {len(record.classes)} classes, "
        f"grid {record.grid_hash[:12]} in {store.root}"
    )


@task.command("list")
@options("bank")
@JSON_FLAG
@handled
def task_list(bank: Path | None, as_json: bool) -> None:
    """List registered tasks and their descriptors."""
    store = open_bank_at(bank)
    rows: list[dict[str, Any]] = []
    for name in store.task_names():
        record = store.task(name)
        rows.append(
            {
                "task": name,
                "probes": len(record.probes),
                "classes": len(record.classes),
                "grid": record.grid_hash,
                "descriptors": store.descriptor_ids(name),
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from ptc.compiler.cli.tables import table

    for line in table(
        [("TASK", "GRID (probes x classes)", "GRID HASH", "DESCRIPTORS")]
        + [
            (
                r["task"],
                f"{r['probes']} x {r['classes']}",
                r["grid"][:12],
                ", ".join(r["descriptors"]) or "-",
            )
            for r in rows
        ]
    ):
        click.echo(line)


# -- descriptors ----------------------------------------------------------------------------------
def _default_id(source: str) -> str:
    stem = Path(source.split(":", 1)[-1].rstrip("/")).name
    return re.sub(r"[^A-Za-z0-9._-]", "-", stem).lstrip(".-_") or "source"


@main.group()
def descriptor() -> None:
    """Compute Universal Task Descriptors."""


@descriptor.command("add")
@flag("--task", "task_name", required=True)
@flag("--source", required=True)
@flag("--finetuned", required=True)
@flag("--id", "descriptor_id", default=None)
@options("batch_size", "device", "precision", "bank")
@handled
def descriptor_add(
    task_name: str,
    source: str,
    finetuned: str,
    descriptor_id: str | None,
    batch_size: int,
    device: str,
    precision: str,
    bank: Path | None,
) -> None:
    """Store UTD = S_ft - S_pre of SOURCE's fine-tune on TASK's grid."""
    from ptc.compiler.sources.descriptor import add_descriptor

    store = open_bank_at(bank)
    entry = add_descriptor(
        store,
        task_name,
        source,
        finetuned,
        descriptor_id or _default_id(source),
        batch_size=batch_size,
        compute=compute_of(device, precision),
    )
    shape = "x".join(map(str, entry.meta["shape"]))
    click.echo(
        f"descriptor {task_name}/{entry.meta['id']}: {shape}, norm {entry.meta['norm']:.4g}, "
        f"sha {entry.sha256[:12]}"
    )


@main.command()
@flag("--task", "task_name", required=True)
@flag("--source", "model", required=True)
@flag("--data", type=click.Path(path_type=Path), required=True)
@flag("--rank", type=click.IntRange(min=1), default=4, show_default=True)
@flag("--steps", type=click.IntRange(min=1), default=250, show_default=True)
@flag("--seed", type=click.IntRange(min=0), default=0, show_default=True)
@flag(
    "--lora-dropout",
    "dropout",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    default=0.0,
    show_default=True,
)
@options("out", "force", "device", "bank")
@handled
def finetune(
    task_name: str,
    model: str,
    data: Path,
    out: Path | None,
    rank: int,
    steps: int,
    seed: int,
    dropout: float,
    force: bool,
    device: str,
    bank: Path | None,
) -> None:
    """Fine-tune a source: rank-4 LoRA on the input tower's q/v, text tower frozen."""
    from ptc import targets
    from ptc.compiler.sources.finetune import finetune_lora
    from ptc.errors import OutputError
    from ptc.output_dirs import check_output_location, check_replaceable
    from ptc.progress import note

    if out is None:
        raise OutputError("--out: required: the folder to write the adapter into", "pass --out DIR")
    out = out.expanduser().resolve()
    store = open_bank_at(bank)
    check_output_location(out, {"the bank": store.root})
    if out.exists() and not out.is_dir():
        raise OutputError(f"output {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise OutputError(f"{out} exists and is not empty", "pass --force to replace it")
        check_replaceable(out)
    stats = finetune_lora(
        targets.load(model),
        store.task(task_name),
        data,
        out,
        rank=rank,
        alpha=2 * rank,
        steps=steps,
        seed=seed,
        dropout=dropout,
        replace=force,
        device=compute_of(device, "fp32").resolved(),
        echo=note,
    )
    click.echo(
        f"adapter -> {out} ({stats['steps']} steps, loss {stats['final_loss']:.3f}, "
        f"last batch accuracy {stats['final_batch_accuracy']:.2f})"
    )


@main.group("bank")
def bank_group() -> None:
    """Fill, show and verify the operator bank."""


@bank_group.command("build")
@click.argument("plan_file", type=click.Path(path_type=Path))
@options("bank")
@flag("--ray", "ray_address", default=None, metavar="ADDRESS|local")
@flag("--replace", is_flag=True)
@options("batch_size", "device", "precision")
@handled
def bank_build(
    plan_file: Path,
    bank: Path | None,
    ray_address: str | None,
    replace: bool,
    batch_size: int,
    device: str,
    precision: str,
) -> None:
    """Compute every missing embedding, descriptor, factor and operator of PLAN_FILE."""
    from ptc.compiler.sources.bank_plan import load_plan, run_plan

    plan = load_plan(plan_file)
    store = open_bank_at(bank)
    counts = run_plan(
        plan, store, ray_address, replace, batch_size, compute=compute_of(device, precision)
    )
    figures = ", ".join(
        f"{k.replace('_', ' ')} {counts.get(k, 0)}"
        for k in (
            "tasks_registered",
            "descriptors_computed",
            "embeddings_computed",
            "factors_computed",
            "operators_solved",
        )
    )
    where = f"Ray at {ray_address}" if ray_address else "in-process"
    click.echo(f"bank {store.root} ({where}): {figures}")


@bank_group.command("show")
@options("bank")
@JSON_FLAG
@handled
def bank_show(bank: Path | None, as_json: bool) -> None:
    """What the bank holds: tasks and their descriptors (made from which source and fine-tune),
    cached embeddings, factors, operators and exports by model, with sizes. Reads records only."""
    from ptc.compiler.cli.bank_show import describe, lines

    shown = describe(open_bank_at(bank))
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    for line in lines(shown):
        click.echo(line)


class ByteSize(click.ParamType):
    """A size on disk: 20GB, 500MB, 1.5TB, or bytes (units are powers of 1000, as `ptc bank
    show` prints them)."""

    name = "size"
    UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGT]?B?)\s*", str(value).upper())
        if not found:
            self.fail(f"{value!r} is not a size (like 20GB, 500MB or 1.5TB)", param, ctx)
        return int(float(found[1]) * self.UNITS[found[2]])


@bank_group.command("prune")
@options("bank")
@flag("--max-size", "max_bytes", type=ByteSize(), default=None)
@flag("--include-locked", is_flag=True)
@flag("--dry-run", is_flag=True)
@JSON_FLAG
@handled
def bank_prune(
    bank: Path | None, max_bytes: int | None, include_locked: bool, dry_run: bool, as_json: bool
) -> None:
    """Remove exported base graphs (exports/), least recently used first: down to --max-size, or
    every one that no recipe's or output's lock names. A removed export is made again by the
    next build that needs it; embeddings, descriptors and operators are never touched."""
    from ptc.compiler.bank.exports import export_folders, plan_prune, remove_export, sweep_pruned
    from ptc.compiler.cli.bank_show import locked_exports, prune_lines, prune_report, require_bank

    store = open_bank_at(bank)
    require_bank(store)
    locked = locked_exports(store)
    plan = plan_prune(export_folders(store), set(locked), max_bytes, include_locked)
    if not dry_run:
        sweep_pruned(store)
        for folder in plan.remove:
            remove_export(store, folder)
    report = prune_report(store, plan, locked, max_bytes, dry_run)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    for line in prune_lines(report):
        click.echo(line)


@bank_group.command("upgrade")
@options("bank")
@handled
def bank_upgrade(bank: Path | None) -> None:
    """Re-seal a bank written by an older ptc (format 2) so every entry is bound to its key."""
    store = open_bank_at(bank)
    count, problems = store.upgrade()
    for problem in problems:
        click.echo(problem, err=True)
    if problems:
        from ptc.errors import BankError

        raise BankError(
            f"{len(problems)} entries of {store.root} failed their check; nothing was upgraded",
            "delete those entries (they are recomputed on demand), then upgrade again",
        )
    click.echo(f"bank {store.root}: {count} entries re-sealed (format 3)")


@bank_group.command("verify")
@options("bank")
@handled
def bank_verify(bank: Path | None) -> None:
    """Re-hash every entry of the bank."""
    store = open_bank_at(bank)
    count, problems = store.verify_all()
    for problem in problems:
        click.echo(problem, err=True)
    click.echo(f"{count} entries checked, {len(problems)} problems in {store.root}")
    if problems:
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
