"""The lab's entry points into the product (declared in pyproject.toml)."""

from __future__ import annotations

from importlib.util import find_spec

# What the `lab` extra installs beyond the product: without them the lab adds nothing.
LAB_DEPENDENCIES = ("sklearn",)


def installed() -> bool:
    return all(find_spec(module) is not None for module in LAB_DEPENDENCIES)


def add_commands(main) -> None:
    """`ptc.commands`: the lab's commands on ptc's group."""
    if installed():
        from ptc.lab.cli import register

        register(main)


def add_schemes() -> None:
    """`ptc.targets`: the `zoo:` scheme and the lab's timm towers."""
    if installed():
        from ptc.lab.zoo_scheme import register

        register()
