"""`ptc bank show`: what a bank holds and what each entry was made from, read off the entries'
sealed records (their safetensors headers) without loading a tensor or importing torch. It
reports what it finds; `ptc bank verify` is what checks the hashes."""

from __future__ import annotations

import json
from pathlib import Path

from .bank import Bank
from .fsio import safetensors_header
from .tables import table

KINDS = ("descriptors", "embeddings", "factors", "operators")  # the bank's folders of safetensors entries


def _record(path: Path) -> dict:
    """The entry's sealed record; {"unreadable": why} for a file that is not one ptc wrote."""
    try:
        with path.open("rb") as handle:
            header = safetensors_header(handle, path.stat().st_size)
        return json.loads(header["__metadata__"]["ptc"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {"unreadable": f"{type(exc).__name__}: {exc}"}


def _files(root: Path, pattern: str) -> list[Path]:
    return sorted(p for p in root.glob(pattern) if p.is_file() and not p.name.startswith("."))


def _size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths)


def describe(bank: Bank) -> dict:
    """Per task its grid and descriptors (with their source and fine-tune), and per kind of
    cache the entries' count and bytes, grouped by the model they belong to."""
    root = bank.root
    tasks = []
    for name in bank.task_names():
        record = bank.task(name)
        descriptors = []
        for path in _files(root / "descriptors" / name, "*.safetensors"):
            meta = _record(path)
            descriptors.append({"id": path.stem, "source": meta.get("source_ref") or meta.get("sources"),
                                "finetuned": meta.get("finetuned_ref"), "shape": meta.get("shape"),
                                "norm": meta.get("norm"), "bytes": path.stat().st_size,
                                **({"unreadable": meta["unreadable"]} if "unreadable" in meta else {})})
        tasks.append({"task": name, "probes": len(record.probes), "classes": len(record.classes),
                      "grid": record.grid_hash, "descriptors": descriptors})
    caches = {}
    for kind in KINDS[1:]:
        by_model: dict[str, dict] = {}
        for path in _files(root / kind, "**/*.safetensors"):
            meta = _record(path)
            model = meta.get("model_ref") or meta.get("target_ref") or "(unreadable)"
            row = by_model.setdefault(model, {"model": model, "entries": 0, "bytes": 0, "tasks": set()})
            row["entries"] += 1
            row["bytes"] += path.stat().st_size
            row["tasks"].add(meta.get("task", "?"))
        caches[kind] = [{**row, "tasks": sorted(row["tasks"])} for row in by_model.values()]
    exports = [{"key": folder.name, "towers": sorted(p.stem for p in folder.glob("*.json")),
                "bytes": _size(_files(folder, "*"))} for folder in sorted((root / "exports").glob("*")) if folder.is_dir()]
    return {"bank": str(root), "tasks": tasks, **caches, "exports": exports,
            "bytes": _size([p for p in root.rglob("*") if p.is_file()])}


def _mb(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.1f} kB"


def lines(shown: dict) -> list[str]:
    out = [f"bank {shown['bank']}: {_mb(shown['bytes'])}", ""]
    rows = [("TASK", "GRID", "HASH", "DESCRIPTOR", "SOURCE", "FINE-TUNE", "NORM")]
    for task in shown["tasks"]:
        grid = f"{task['probes']} x {task['classes']}"
        for i, d in enumerate(task["descriptors"] or [{}]):
            source = d.get("source")
            source = ", ".join(source) if isinstance(source, list) else source
            rows.append((task["task"] if i == 0 else "", grid if i == 0 else "", task["grid"][:12] if i == 0 else "",
                         d.get("id", "-"), str(source or "-"), str(d.get("finetuned") or "-"),
                         f"{d['norm']:.4g}" if isinstance(d.get("norm"), (int, float)) else "-"))
    out += table(rows)
    for kind in KINDS[1:]:
        out += ["", f"{kind}:"]
        rows = [("MODEL", "ENTRIES", "SIZE", "TASKS")] + [
            (r["model"], str(r["entries"]), _mb(r["bytes"]), ", ".join(r["tasks"])) for r in shown[kind]]
        out += table(rows) if shown[kind] else ["  (none)"]
    out += ["", "exports:"]
    out += table([("KEY", "TOWERS", "SIZE")] + [(e["key"], ", ".join(e["towers"]), _mb(e["bytes"]))
                                                  for e in shown["exports"]]) if shown["exports"] else ["  (none)"]
    return out
