"""Typed errors. The CLI turns each into one line (plus its hint) and an exit code.

Bad input of any kind (recipe, task file, bank entry, model reference) exits 2 and writes
nothing; a build whose numerical verification fails exits 3 with the measured figure.
"""

from collections.abc import Iterator
from contextlib import contextmanager


class PtcError(Exception):
    """Base class: `message` says what is wrong, `hint` what to do about it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
        # ptc's own text: one line, except where a message lists one problem a line on purpose
        # (--locked's drifted inputs); library text reaches it condensed (`library_errors`).
        return f"{self.message} (hint: {self.hint})" if self.hint else self.message


class InputError(PtcError):
    """A YAML file (recipe, task) that does not parse or validate."""


class RecipeError(InputError):
    pass


class TaskError(InputError):
    pass


class BankError(PtcError):
    """A missing, corrupt or conflicting bank entry."""


class ModelNotFound(PtcError):
    """A model reference that resolves to nothing on this machine."""


class ModelError(PtcError):
    """A model that loads but cannot be used as asked (e.g. its text tower changed)."""


class OutputError(PtcError):
    """An output location that cannot be written safely."""


class VerifyError(PtcError):
    """A numerical check that failed; the message carries the measured figure."""

    exit_code = 3


class PlanError(InputError):
    """A bank plan file (`ptc bank build PLAN.yaml`) that does not validate."""


# -- errors raised inside the libraries ptc calls -------------------------------------------------
# What a user can do when a library fails inside a command, by the library's top-level package.
LIBRARY_HINTS = {
    "transformers": "the checkpoint folder is damaged, or was written by an incompatible transformers",
    "tokenizers": "the tokenizer files are damaged, or were written by an incompatible tokenizers",
    "huggingface_hub": "the checkpoint folder is damaged",
    "open_clip": "the open_clip config names something this open_clip cannot build",
    "timm": "the open_clip config names a timm tower this timm cannot build",
    "peft": "the adapter was not trained on this base model, or by an incompatible peft",
    "safetensors": "a .safetensors file is damaged or truncated",
    "onnx": "an ONNX graph is damaged, or needs another onnx version",
    "onnxscript": "the ONNX exporter could not convert the model",
    "onnxruntime": "onnxruntime could not load or run an ONNX graph",
    "torch": "a tensor operation failed",
    "PIL": "an input image could not be decoded",
}


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of `text`, cut at `limit` characters; a note where more followed
    (library reports run to dozens of lines: the whole text is --debug's)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    if not lines:
        return ""
    head = lines[0] if len(lines[0]) <= limit else lines[0][:limit] + "..."
    return head + (f" [{len(lines) - 1} more line(s): --debug]" if len(lines) > 1 else "")


def libraries_of(exc: BaseException) -> list[str]:
    """The libraries on `exc`'s way up, outermost (the one ptc called) first: the packages of
    LIBRARY_HINTS its traceback passes through, else that of the exception's own class."""
    import traceback

    found: list[str] = []
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        package = str(frame.f_globals.get("__name__", "")).split(".")[0]
        if package in LIBRARY_HINTS and package not in found and package != "torch":
            found.append(package)
    package = type(exc).__module__.split(".")[0]
    if not found and package in LIBRARY_HINTS:
        found.append(package)
    return found


def library_of(exc: BaseException) -> str | None:
    """The libraries that raised `exc`, as `called/raised` where the one ptc called (open_clip)
    failed inside another (timm); None outside every library of LIBRARY_HINTS."""
    found = libraries_of(exc)
    if not found:
        return None
    return found[0] if len(found) == 1 else f"{found[0]}/{found[-1]}"


def library_hint(library: str | None) -> str | None:
    """The hint of the innermost library named by `library_of` (the most specific)."""
    return LIBRARY_HINTS.get(library.split("/")[-1]) if library else None


def condensed(exc: BaseException) -> str:
    """`Type: first line of the message`, one line whatever the library wrote."""
    return f"{type(exc).__name__}: {first_line(str(exc)) or 'no message'}"


@contextmanager
def library_errors(
    what: str, hint: str | None = None, error: type[PtcError] | None = None
) -> Iterator[None]:
    """Any exception a library raises inside the block becomes `error` (ModelError by default)
    with one line: `what`, the library and its message's first line; the original stays
    chained to it for --debug. ptc's own errors pass through unchanged."""
    try:
        yield
    except PtcError:
        raise
    except Exception as exc:
        library = library_of(exc)
        raise (error or ModelError)(
            f"{what}: {library or 'Python'} raised {condensed(exc)}", hint or library_hint(library)
        ) from exc
