"""`ptc bank show` and `ptc bank prune`'s report: what a bank holds, the space each part takes,
and what each entry was made from, read off the entries' sealed records (their safetensors
headers) without loading a tensor or importing torch. It reports what it finds; `ptc bank
verify` is what checks the hashes."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ptc.compiler.bank.exports import (
    ExportFolder,
    PrunePlan,
    export_folders,
)
from ptc.compiler.bank.store import LOCKS_FILE, MARKER, Bank
from ptc.compiler.cli.tables import table
from ptc.compiler.recipe.lock import named_base_exports
from ptc.errors import BankError

PARTS = (
    "tasks",
    "descriptors",
    "embeddings",
    "factors",
    "operators",
    "checks",
    "exports",
    "runtimes",
)
CACHES = {
    "embeddings": "embeddings",
    "factors": "factors",
    "operator": "operators",
    "check_reference": "checks",
}  # record kind -> section
RUNTIME_FIELDS = ("model_ref", "machine", "images_per_second", "chosen")


def _size(paths: Iterable[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file())


def describe(bank: Bank) -> dict[str, Any]:
    """Per task its grid and descriptors (with their source and fine-tune), and per kind of
    cache the entries' count and bytes, grouped by the model they belong to. Every entry is
    placed by its own record (kind, task, model), not by where it lies."""
    require_bank(bank)
    entries = {rel: bank.entry_record(rel) for rel in bank.entry_paths()}
    sizes = {rel: (bank.root / rel).stat().st_size for rel in entries}
    descriptors: dict[Any, list[dict[str, Any]]] = {}  # by task, as each record names it
    caches: dict[str, dict[Any, dict[str, Any]]] = {section: {} for section in CACHES.values()}
    for rel, meta in entries.items():
        if meta.get("kind") == "descriptor":
            descriptors.setdefault(meta.get("task"), []).append(
                {
                    "id": meta.get("id"),
                    "source": meta.get("source_ref"),
                    "finetuned": meta.get("finetuned_ref"),
                    "shape": meta.get("shape"),
                    "norm": meta.get("norm"),
                    "bytes": sizes[rel],
                }
            )
        elif meta.get("kind") in CACHES:
            model = meta.get("model_ref") or meta.get("target_ref")
            row = caches[CACHES[meta["kind"]]].setdefault(
                model, {"model": model, "entries": 0, "bytes": 0, "tasks": set()}
            )
            row["entries"] += 1
            row["bytes"] += sizes[rel]
            if meta["kind"] != "check_reference":  # a check batch spans the recipe's grids
                row["tasks"].add(meta.get("task", "?"))
    tasks = []
    for name in bank.task_names():
        record = bank.task(name)
        tasks.append(
            {
                "task": name,
                "probes": len(record.probes),
                "classes": len(record.classes),
                "grid": record.grid_hash,
                "descriptors": sorted(descriptors.get(name, []), key=lambda d: d["id"]),
            }
        )
    unreadable = {rel: meta["unreadable"] for rel, meta in entries.items() if "unreadable" in meta}
    try:
        locked = locked_exports(bank)
    except BankError as exc:  # shown, not fatal: `bank prune` is what needs the list
        locked, unreadable[LOCKS_FILE] = {}, exc.message
    exports = [
        {
            "key": folder.key,
            "towers": list(folder.towers),
            "bytes": folder.bytes,
            "last_used": _when(folder.last_used),
            "locked_by": locked.get(folder.key, []),
        }
        for folder in export_folders(bank)
    ]
    runtimes = []
    for path in sorted(bank.root.glob("runtimes/*.json")):
        try:
            measured = bank.runtime_speed(path.stem) or {}
        except BankError as exc:
            unreadable[str(path.relative_to(bank.root))] = exc.message
            continue
        runtimes.append({k: measured.get(k) for k in RUNTIME_FIELDS})
    return {
        "bank": str(bank.root),
        "tasks": tasks,
        **{
            section: [{**row, "tasks": sorted(row["tasks"])} for row in rows.values()]
            for section, rows in caches.items()
        },
        "exports": exports,
        "runtimes": runtimes,
        "unreadable": unreadable,
        "bytes": _size(bank.root.rglob("*")),
        "parts": {part: _size((bank.root / part).rglob("*")) for part in PARTS},
    }


def require_bank(bank: Bank) -> None:
    """A folder that holds no bank is one clear error, before anything is read or removed."""
    if not bank.exists():
        raise BankError(
            f"no bank at {bank.root} (no {MARKER} there)",
            "pass --bank DIR, or set $PTC_BANK; `ptc task add` makes one",
        )


def locked_exports(bank: Bank) -> dict[str, list[str]]:
    """Export key -> the lock files (remembered by the bank, still on disk) that name it."""
    locked: dict[str, list[str]] = {}
    for lock in bank.remembered_locks():
        for key in sorted(named_base_exports(Path(lock))):
            locked.setdefault(key, []).append(lock)
    return locked


def _when(seconds: float) -> str | None:
    return (
        datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        if seconds
        else None
    )


def prune_report(
    bank: Bank, plan: PrunePlan, locked: dict[str, list[str]], max_bytes: int | None, dry_run: bool
) -> dict[str, Any]:
    def row(folder: ExportFolder) -> dict[str, Any]:
        return {
            "key": folder.key,
            "towers": list(folder.towers),
            "bytes": folder.bytes,
            "last_used": _when(folder.last_used),
            "locked_by": locked.get(folder.key, []),
        }

    return {
        "bank": str(bank.root),
        "dry_run": dry_run,
        "max_bytes": max_bytes,
        "removed": [row(f) for f in plan.remove],
        "kept_locked": [row(f) for f in plan.keep_locked],
        "exports_bytes_before": plan.bytes_before,
        "exports_bytes_after": plan.bytes_after,
    }


def prune_lines(report: dict[str, Any]) -> list[str]:
    verb = "would remove" if report["dry_run"] else "removed"
    out = [
        f"{verb} exports/{r['key']} ({', '.join(r['towers'])}; {_mb(r['bytes'])}, "
        f"last used {r['last_used'] or 'never'})"
        for r in report["removed"]
    ]
    out += [
        f"kept exports/{r['key']} ({_mb(r['bytes'])}): named by {', '.join(r['locked_by'])} "
        "(--include-locked removes it)"
        for r in report["kept_locked"]
    ]
    freed = report["exports_bytes_before"] - report["exports_bytes_after"]
    summary = (
        f"bank {report['bank']}: exports {_mb(report['exports_bytes_before'])} -> "
        f"{_mb(report['exports_bytes_after'])} ({verb} {len(report['removed'])}, {_mb(freed)})"
    )
    cap = report["max_bytes"]
    if cap is not None and report["exports_bytes_after"] > cap:
        summary += f"; still over {_mb(cap)}: locked exports are kept"
    return out + [summary]


def _mb(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.1f} kB"


def lines(shown: dict[str, Any]) -> list[str]:
    parts = ", ".join(f"{part} {_mb(size)}" for part, size in shown["parts"].items())
    out = [f"bank {shown['bank']}: {_mb(shown['bytes'])} ({parts})", ""]
    rows = [("TASK", "GRID", "HASH", "DESCRIPTOR", "SOURCE", "FINE-TUNE", "NORM")]
    for task in shown["tasks"]:
        grid = f"{task['probes']} x {task['classes']}"
        for i, d in enumerate(task["descriptors"] or [{}]):
            rows.append(
                (
                    task["task"] if i == 0 else "",
                    grid if i == 0 else "",
                    task["grid"][:12] if i == 0 else "",
                    d.get("id", "-"),
                    str(d.get("source") or "-"),
                    str(d.get("finetuned") or "-"),
                    f"{d['norm']:.4g}" if isinstance(d.get("norm"), (int, float)) else "-",
                )
            )
    out += table(rows)
    for kind in CACHES.values():
        out += ["", f"{kind}:"]
        cache_rows = [("MODEL", "ENTRIES", "SIZE", "TASKS")] + [
            (r["model"], str(r["entries"]), _mb(r["bytes"]), ", ".join(r["tasks"]))
            for r in shown[kind]
        ]
        out += table(cache_rows) if shown[kind] else ["  (none)"]
    out += ["", "exports:"]
    out += (
        table(
            [("KEY", "TOWERS", "SIZE", "LAST USED", "LOCKED BY")]
            + [
                (
                    e["key"],
                    ", ".join(e["towers"]),
                    _mb(e["bytes"]),
                    e["last_used"] or "never",
                    ", ".join(e["locked_by"]) or "-",
                )
                for e in shown["exports"]
            ]
        )
        if shown["exports"]
        else ["  (none)"]
    )
    out += ["", "embedding runtimes measured (--embed-runtime auto):"]
    out += (
        table(
            [("MODEL", "MACHINE", "TORCH IMG/S", "ONNXRUNTIME IMG/S", "CHOSEN")]
            + [
                (
                    str(r["model_ref"]),
                    str(r["machine"]),
                    *(
                        f"{(r['images_per_second'] or {}).get(n, 0):.3g}"
                        for n in ("torch", "onnxruntime")
                    ),
                    str(r["chosen"]),
                )
                for r in shown["runtimes"]
            ]
        )
        if shown["runtimes"]
        else ["  (none)"]
    )
    return out + [
        f"unreadable: {rel} ({why}; `ptc bank verify` checks every entry)"
        for rel, why in shown["unreadable"].items()
    ]
