"""`ptc`: the command line. Each command is a thin shell over one library call; every
PtcError becomes one line on stderr and its exit code (2 bad input, 3 failed verification)."""

from __future__ import annotations

import functools
import json
import re
import sys
import warnings
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from ptc import __version__
from ptc.compiler.cli.flags import RUN_OPTIONS, Decorator, RunFlag, flag
from ptc.errors import PtcError, condensed, library_hint, library_of

if TYPE_CHECKING:  # imported where a command uses them: `ptc task list` imports no torch
    from ptc.compiler.bank.store import Bank
    from ptc.devices import Compute


def options(*names: str) -> Decorator:
    """The flags of these run options (flags.RUN_OPTIONS; the defaults are Options'), passed to
    the command under their field names."""
    from ptc.compiler.recipe.options import Options

    defaults = {f.name: f.default for f in fields(Options)}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for name in reversed(names):
            command = _flag(name, RUN_OPTIONS[name], defaults[name])(command)
        return command

    return decorate


def _flag(name: str, option: RunFlag, default: Any) -> Decorator:
    if option.kind == "negated":  # --no-export sets export=False
        return click.option(option.flag, name, flag_value=False, default=True, help=option.help)
    if option.kind == "switch":
        return click.option(option.flag, name, is_flag=True, help=option.help)
    kind = {
        "path": click.Path(path_type=Path),
        "count": click.IntRange(min=1),
        "text": str,
        "choice": click.Choice(option.choices),
    }[option.kind]
    return click.option(
        option.flag,
        name,
        type=kind,
        default=default,
        show_default=default is not None,
        help=option.help,
    )


def _compute(device: str, precision: str) -> Compute:
    """--device and --precision, the device checked here (a missing one is exit 2, before loading)."""
    from ptc.devices import Compute

    compute = Compute(device, precision)
    compute.resolved()
    return compute


JSON_FLAG = flag("--json", "as_json", is_flag=True)


def _fail(message: str, code: int) -> None:
    click.echo(f"ptc: error: {message}", err=True)
    sys.exit(code)


class Terminated(BaseException):
    """SIGTERM (a scheduler, a container stop, CI's timeout), raised where the process is, so
    that every staging folder and temporary file is cleaned up on the way out, as for Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


def _filesystem_error(exc: OSError) -> str:
    """One line for an operating-system refusal (read-only bank, full disk, a path through a file)."""
    where = f"{exc.filename}: " if exc.filename else ""
    return f"{where}{exc.strerror or exc}" + (
        " (read-only or not yours?)" if isinstance(exc, PermissionError) else ""
    )


# -- flags every command takes, wherever they are written ---------------------------------------
def _remember(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[f"ptc.{param.name}"] = True
    return value


def common_options() -> list[click.Option]:
    """--debug, -q and -v: taken by every command (after it, as `ptc build r.yaml --debug`) and by
    `ptc` itself (before it); read by `handled` when the command runs."""
    from ptc.compiler.cli.flags import ARGUMENTS

    def switch(*names: str) -> click.Option:
        return click.Option(
            list(names),
            is_flag=True,
            expose_value=False,
            callback=_remember,
            help=ARGUMENTS[names[-1]],
        )

    return [switch("--debug"), switch("-q", "--quiet"), switch("-v", "--verbose")]


def with_common_options(command: click.Command) -> click.Command:
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            with_common_options(sub)
    elif not any(p.name == "quiet" for p in command.params):
        command.params.extend(common_options())
    return command


def _apply_common(ctx: click.Context) -> bool:
    """Set verbosity from the flags given anywhere on the line; True under --debug."""
    import os

    from ptc.progress import set_verbosity

    debug, quiet, verbose = (
        bool(ctx.meta.get(f"ptc.{name}")) for name in ("debug", "quiet", "verbose")
    )
    if quiet and verbose:
        raise click.UsageError("-q and -v: give one or the other", ctx)
    set_verbosity(quiet, verbose)
    if not (debug or verbose):  # libraries' deprecation and config chatter is not for ptc's users
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        # read when transformers is first imported
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        if "transformers" in sys.modules:
            sys.modules["transformers"].logging.set_verbosity_error()
    return debug


def handled(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn library errors into one line and an exit code; --debug shows the traceback."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        debug = _apply_common(click.get_current_context())
        try:
            return command(*args, **kwargs)
        except PtcError as exc:
            if debug:
                raise
            _fail(exc.one_line(), exc.exit_code)
        except KeyboardInterrupt:
            _fail("interrupted; nothing was written", 130)
        except Terminated:
            _fail("terminated (SIGTERM); nothing was written", 143)
        except OSError as exc:  # the environment refused, not bad code: exit 2, one line
            if debug:
                raise
            _fail(_filesystem_error(exc), 2)
        except Exception as exc:  # a bug, not bad input: say so, in one line, and point at --debug
            if debug:
                raise
            library = library_of(exc)
            where = f" in {library}" if library else ""
            hint = f"{library_hint(library)}; " if library else ""
            _fail(
                f"internal error{where}: {condensed(exc)} (hint: {hint}run with --debug for the traceback)",
                1,
            )

    return wrapper


def _command_path(ctx: click.Context) -> str:
    """`ptc SUBCOMMAND ...` however ptc was started (`python -m ...` names the root otherwise)."""
    names: list[str] = []
    while ctx.parent is not None:
        names.append(ctx.info_name or "")
        ctx = ctx.parent
    return " ".join(["ptc", *reversed(names)])


COMMAND_PLUGINS = "ptc.commands"  # entry points: a callable taking ptc's group (the lab's commands)


class PtcSubgroup(click.Group):
    """A group of ptc's (`ptc task`, `ptc bank`): every command added gets the common flags."""

    group_class: type[click.Group] | type[type] | None = type

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        super().add_command(with_common_options(cmd), name)


class PtcGroup(PtcSubgroup):
    """ptc itself: click, with every usage error (an unknown option, a value out of range) as
    one line and exit 2 like any other bad input, SIGTERM handled as Ctrl-C is, and the
    commands of installed plugins added when it is first asked for its commands (importing
    this module imports no plugin)."""

    _plugins_loaded = False
    group_class = PtcSubgroup

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        for entry in entry_points(group=COMMAND_PLUGINS):
            try:
                add_commands = entry.load()
            except ImportError:  # a plugin whose dependencies are missing adds nothing
                continue
            add_commands(self)

    def list_commands(self, ctx: click.Context) -> list[str]:
        self._load_plugins()
        return super().list_commands(ctx)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        self._load_plugins()
        return super().get_command(ctx, name)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        import signal
        import threading

        kwargs["standalone_mode"] = False
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGTERM, _raise_terminated)
        try:
            code = super().main(*args, **kwargs)
        except click.exceptions.Abort:
            _fail("interrupted; nothing was written", 130)
        except Terminated:
            _fail("terminated (SIGTERM); nothing was written", 143)
        except click.ClickException as exc:
            hint = (
                f" (hint: see `{_command_path(exc.ctx)} --help`)"
                if isinstance(exc, click.UsageError) and exc.ctx
                else ""
            )
            _fail(f"{exc.format_message()}{hint}", exc.exit_code)
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
        sys.exit(code if isinstance(code, int) else 0)


@click.group(
    cls=PtcGroup, context_settings={"help_option_names": ["-h", "--help"]}, params=common_options()
)
@click.version_option(__version__, prog_name="ptc")
def main() -> None:
    """ptc, the platonic task compiler: recipes of signed task sums -> edited encoders."""


def _bank(path: Path | None) -> Bank:
    from ptc.compiler.recipe.options import Options

    return Options(bank=path).open_bank()


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

    store = _bank(bank)
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
    store = _bank(bank)
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

    store = _bank(bank)
    entry = add_descriptor(
        store,
        task_name,
        source,
        finetuned,
        descriptor_id or _default_id(source),
        batch_size=batch_size,
        compute=_compute(device, precision),
    )
    shape = "x".join(map(str, entry.meta["shape"]))
    click.echo(
        f"descriptor {task_name}/{entry.meta['id']}: {shape}, norm {entry.meta['norm']:.4g}, "
        f"sha {entry.sha256[:12]}"
    )


# -- recipes --------------------------------------------------------------------------------------
@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@options("bank", "out")
@JSON_FLAG
@handled
def check(recipe: Path, bank: Path | None, out: Path | None, as_json: bool) -> None:
    """Validate RECIPE and resolve every term against the bank, loading no weights."""
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan

    # check writes nothing: an existing output is fine
    p = plan(recipe, Options(bank=bank, out=out, export=False))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "recipe": str(p.recipe_path),
                    "target": p.recipe.target,
                    "target_location": str(p.target_location),
                    "route": p.recipe.route,
                    "bank": str(p.bank.root),
                    "output": str(p.out_dir) if p.out_dir else None,
                    "terms": [
                        {
                            "task": pt.term.task,
                            "source": pt.term.label,
                            "weight": pt.term.weight,
                            "sources": list(pt.term.sources),
                            "probes": len(pt.task.probes),
                            "classes": len(pt.task.classes),
                            "grid": pt.task.grid_hash,
                        }
                        for pt in p.terms
                    ],
                },
                indent=2,
            )
        )
        return
    click.echo(f"target {p.recipe.target} -> {p.target_location}")
    click.echo(f"route {p.recipe.route}")
    for pt in p.terms:
        weighting = f", {pt.term.weighting} weights" if pt.term.weighting else ""
        kind = (
            ""
            if len(pt.term.sources) == 1
            else f", {pt.term.combine} of {len(pt.term.sources)}{weighting}"
        )
        click.echo(
            f"  {pt.term.weight:+g} x {pt.term.task}/{pt.term.label}{kind}  "
            f"({len(pt.task.probes)}x{len(pt.task.classes)}, grid {pt.task.grid_hash[:12]})"
        )
    click.echo(f"bank {p.bank.root}; output {p.out_dir or '(none: set export.out or --out)'}")
    click.echo("ok")


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@options("bank", "out", "force", "batch_size", "device", "precision", "export", "locked")
@JSON_FLAG
@handled
def build(
    recipe: Path,
    bank: Path | None,
    out: Path | None,
    force: bool,
    batch_size: int,
    device: str,
    precision: str,
    export: bool,
    locked: bool,
    as_json: bool,
) -> None:
    """Build RECIPE: solve, fold, verify, export; then record the build in RECIPE.lock."""
    from ptc.compiler.build.pipeline import execute
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan
    from ptc.progress import verbose

    options = Options(
        bank=bank,
        out=out,
        force=force,
        batch_size=batch_size,
        device=device,
        precision=precision,
        export=export,
        locked=locked,
    )
    p = plan(recipe, options)
    report = execute(p, options)
    # report.json's content, where it went, this run's record and what happened to the lock
    if as_json:
        click.echo(
            json.dumps(
                {
                    "out": str(report.out_dir) if report.out_dir else None,
                    "report": report.to_json(),
                    "run": report.run,
                    "recipe_lock": report.recipe_lock,
                },
                indent=2,
                default=str,
            )
        )
        return
    for line in report.summary_lines():
        click.echo(line)
    if verbose():
        timings = report.run.get("timings", {})
        click.echo(
            "stages: " + ", ".join(f"{stage} {seconds:.2f}s" for stage, seconds in timings.items())
        )


@main.command("lock")
@click.argument("recipe", type=click.Path(path_type=Path))
@options("bank")
@flag("--lock-file", type=click.Path(path_type=Path), default=None)
@handled
def lock_command(recipe: Path, bank: Path | None, lock_file: Path | None) -> None:
    """Write RECIPE's lock without building: every input's fingerprint, the settings and versions."""
    from ptc import targets
    from ptc.compiler.recipe.lock import (
        lock_document,
        lock_inputs,
        previous_lock,
        recipe_lock_path,
        write_recipe_lock,
    )
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan

    p = plan(recipe, Options(bank=bank, export=False))
    path = lock_file or recipe_lock_path(p.recipe_path)
    before = previous_lock(path)
    document = lock_document(lock_inputs(p, targets.load(p.recipe.target, p.base_dir)))
    if before is not None and before["inputs"] == document["inputs"]:
        click.echo(f"lock {path}: unchanged ({document['lock_hash'][:12]})")
        return
    write_recipe_lock(path, document)
    click.echo(
        f"lock {path}: written ({document['lock_hash'][:12]}; outputs are recorded by `ptc build`)"
    )


@main.command("verify")
@click.argument("output", type=click.Path(path_type=Path))
@flag("--lock-file", type=click.Path(path_type=Path), default=None)
@JSON_FLAG
@handled
def verify_command(output: Path, lock_file: Path | None, as_json: bool) -> None:
    """Re-hash OUTPUT against its lock and check its report's figures; exit 0 only if all hold."""
    from ptc.compiler.recipe.lock import verify_output

    checked, problems = verify_output(output, lock_file)
    if as_json:
        click.echo(
            json.dumps({"output": str(output), "files": checked, "problems": problems}, indent=2)
        )
    else:
        for problem in problems:
            click.echo(f"{output}/{problem}", err=True)
        click.echo(f"{output}: {checked} files checked, {len(problems)} problems")
    if problems:
        sys.exit(3)


@main.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@JSON_FLAG
@handled
def diff_command(a: Path, b: Path, as_json: bool) -> None:
    """What differs between two locks or two output folders: terms, weights, fingerprints,
    settings, versions, outputs."""
    from ptc.compiler.recipe.lock import describe, differences, load_lock_or_output

    found = [
        d
        for d in differences(load_lock_or_output(a), load_lock_or_output(b))
        if d["path"] != "seal"
    ]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for difference in found:
        click.echo(describe(difference))
    click.echo(f"{len(found)} difference(s)" if found else "identical")


@main.command()
@click.argument("output", type=click.Path(path_type=Path))
@flag("--data", type=click.Path(path_type=Path), required=True)
@flag("--task", "task_name", default=None)
@options("batch_size", "device", "precision")
@JSON_FLAG
@handled
def certify(
    output: Path,
    data: Path,
    task_name: str | None,
    batch_size: int,
    device: str,
    precision: str,
    as_json: bool,
) -> None:
    """Composition certificate of a built OUTPUT: inputs whose prediction provably equals the
    single-task model's, whatever the other terms do."""
    from ptc.compiler.verify.certify import certify_output

    if not data.is_dir():
        from ptc.errors import RecipeError

        raise RecipeError(
            f"--data: {data} is not a folder", "give a folder of input files (subfolders are read)"
        )
    figures = certify_output(
        output, data, task_name, batch_size, compute=_compute(device, precision)
    )
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    click.echo(
        f"{figures['task']}: {figures['certified']}/{figures['inputs']} certified "
        f"({figures['certified_fraction']:.1%}); certified changed {figures['certified_changed']}, "
        f"changed in all {figures['changed']}"
    )


# -- evaluation, fine-tuning, bank ----------------------------------------------------------------
@main.command("eval")
@click.argument("model")
@flag("--task", "task_name", required=True)
@flag("--data", type=click.Path(path_type=Path), required=True)
@JSON_FLAG
@options("batch_size", "device", "precision", "bank")
@handled
def eval_command(
    model: str,
    task_name: str,
    data: Path,
    as_json: bool,
    batch_size: int,
    device: str,
    precision: str,
    bank: Path | None,
) -> None:
    """Zero-shot top-1 accuracy of MODEL (a reference or a build output folder)."""
    from ptc.compiler.verify.evaluate import evaluate

    result = evaluate(
        model, _bank(bank).task(task_name), data, batch_size, compute=_compute(device, precision)
    )
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(
            f"{task_name}: top-1 {result['accuracy']:.4f} ({result['correct']}/{result['total']})"
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
    store = _bank(bank)
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
        device=_compute(device, "fp32").resolved(),
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
    store = _bank(bank)
    counts = run_plan(
        plan, store, ray_address, replace, batch_size, compute=_compute(device, precision)
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

    shown = describe(_bank(bank))
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    for line in lines(shown):
        click.echo(line)


@bank_group.command("upgrade")
@options("bank")
@handled
def bank_upgrade(bank: Path | None) -> None:
    """Re-seal a bank written by an older ptc (format 2) so every entry is bound to its key."""
    store = _bank(bank)
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
    store = _bank(bank)
    count, problems = store.verify_all()
    for problem in problems:
        click.echo(problem, err=True)
    click.echo(f"{count} entries checked, {len(problems)} problems in {store.root}")
    if problems:
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    main()
