"""Typed errors. The CLI turns each into one line (plus its hint) and an exit code.

Bad input of any kind (recipe, task file, bank entry, model reference) exits 2 and writes
nothing; a build whose numerical verification fails exits 3 with the measured figure.
"""


class PtcError(Exception):
    """Base class: `message` says what is wrong, `hint` what to do about it."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def one_line(self) -> str:
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
