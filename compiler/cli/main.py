"""`ptc`: the command line. Each command is a thin shell over one library call (app.py holds
what they share; the commands are in build_commands.py and bank_commands.py)."""

from __future__ import annotations

from ptc.compiler.cli import bank_commands, build_commands  # noqa: F401  (they register their commands)
from ptc.compiler.cli.app import main

__all__ = ["main"]

if __name__ == "__main__":  # pragma: no cover
    main()
