"""The compiler: recipe -> plan -> execute -> verify -> export, the operator bank and the CLI."""

from .. import __version__  # noqa: F401  (re-exported: modules here say `from . import __version__`)
