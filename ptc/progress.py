"""Progress of long steps, on stderr: a bar on a terminal, plain lines when stderr goes to a
file or a pipe (CI, nohup, `2> build.log`), where a bar would print nothing until the end (tqdm
turns itself off there) or a wall of carriage returns. `-q` silences both; results go to
stdout either way.

Off a terminal a step prints a line every LINE_SECONDS while it runs and one when it ends, so a
log shows what a build was doing when it stopped and how long each step took.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator

LINE_SECONDS = 10.0

_quiet = False
_verbose = False


def set_verbosity(quiet: bool, verbose: bool) -> None:
    """`-q`: no progress at all (errors and results still print); `-v`: more detail."""
    global _quiet, _verbose
    _quiet, _verbose = quiet, verbose


def quiet() -> bool:
    return _quiet


def verbose() -> bool:
    return _verbose


def note(line: str) -> None:
    """A line of progress that is not a bar (a training's figures, a stage starting), on stderr."""
    if not _quiet:
        print(line, file=sys.stderr, flush=True)


class Progress:
    """One step's progress: `update()` per unit done, `set_postfix()` for figures (a loss)."""

    def __init__(self, total: int | None, desc: str, units: str = "steps", enabled: bool = True):
        self.total, self.desc, self.units = total, desc, units
        self.done, self.figures = 0, ""
        self.mode = "off" if _quiet or not enabled else "bar" if sys.stderr.isatty() else "lines"
        self.start = self.last_line = time.monotonic()
        self.bar = None
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit=units, leave=False, file=sys.stderr)

    def update(self, count: int = 1) -> None:
        self.done += count
        if self.bar is not None:
            self.bar.update(count)
        elif self.mode == "lines" and time.monotonic() - self.last_line >= LINE_SECONDS:
            self._line("")

    def set_postfix(self, **figures: object) -> None:
        self.figures = ", ".join(f"{name} {value}" for name, value in figures.items())
        if self.bar is not None:
            self.bar.set_postfix(figures)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "lines":
            self._line(" done")
        self.mode = "off"

    def _line(self, state: str) -> None:
        now = time.monotonic()
        seconds = now - self.start
        of = f"/{self.total}" if self.total is not None else ""
        figures = f", {self.figures}" if self.figures else ""
        left = ""
        if not state and self.total and self.done:
            left = f", about {_duration(seconds / self.done * (self.total - self.done))} left"
        print(
            f"{self.desc}: {self.done}{of} {self.units}{figures}, {_duration(seconds)}{left}{state}",
            file=sys.stderr,
            flush=True,
        )
        self.last_line = now

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
        elif self.bar is not None:  # an interrupted step says nothing more than the error will
            self.bar.close()


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.0f} min"


def track(
    items: Iterable, total: int | None, desc: str, units: str = "steps", enabled: bool = True
) -> Iterator:
    """Yield `items`, reporting each as one unit done."""
    with Progress(total, desc, units, enabled) as progress:
        for item in items:
            yield item
            progress.update()
