"""Plain-text tables for what commands print: aligned columns under a header row."""

from __future__ import annotations

from collections.abc import Sequence


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Aligned columns, the first row a header; trailing spaces trimmed."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows
    ]
