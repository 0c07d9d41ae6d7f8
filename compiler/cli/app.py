"""The `ptc` group and what every command shares: run-option flags, the common flags
(--debug, -q, -v), and `handled`, which turns every PtcError into one line on stderr and its
exit code (2 bad input, 3 failed verification), a library's failure included."""

from __future__ import annotations

import functools
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


def compute_of(device: str, precision: str) -> Compute:
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


def open_bank_at(path: Path | None) -> Bank:
    from ptc.compiler.recipe.options import Options

    return Options(bank=path).open_bank()
