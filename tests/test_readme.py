"""The README's worked example is recipes/example.sh: the README holds its text, and the
script runs as written, end to end, on the committed zoo's models (trained here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "recipes" / "example.sh"


def _shown(script: str) -> str:
    """What the README shows: the script after its header (shebang, comments, `set`)."""
    return script.split("set -euo pipefail\n\n", 1)[1]


def test_the_readme_shows_the_worked_example_exactly_as_the_script_runs_it():
    readme = (REPO / "README.md").read_text()
    assert f"```bash\n{_shown(SCRIPT.read_text())}```" in readme


def test_the_worked_example_runs_as_written(tmp_path):
    """In a checkout of what the script reads (as a fresh clone holds it), through the
    installed `ptc` command; the accuracies `ptc eval` prints are the build report's."""
    for part in ("zoo/models/clip", "zoo/models/siglip", "zoo/sources/siglip/shape-s0"):
        shutil.copytree(REPO / part, tmp_path / part)
    for task in ("shape", "background"):
        for part in ("probes", "test"):
            shutil.copytree(
                REPO / "zoo/world/tasks" / task / part, tmp_path / "zoo/world/tasks" / task / part
            )
        shutil.copy(
            REPO / "zoo/world/tasks" / task / "task.yaml", tmp_path / "zoo/world/tasks" / task
        )
    (tmp_path / "recipes").mkdir()
    for name in ("example.sh", "example.yaml"):
        shutil.copy(REPO / "recipes" / name, tmp_path / "recipes")
    path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    result = subprocess.run(
        ["bash", "recipes/example.sh"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": path},
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert "ok" in out and any(line.startswith("built ") for line in out)
    report = json.loads((tmp_path / "recipes/dist/example-edit/report.json").read_text())
    shape = report["evaluation"]["shape"]
    edited, unedited = [line for line in out if line.startswith("shape: top-1 ")]
    assert edited.startswith(f"shape: top-1 {shape['after']:.4f} ")
    assert unedited.startswith(f"shape: top-1 {shape['before']:.4f} ")
    assert (tmp_path / "recipes/example.lock").is_file() and (
        tmp_path / "example-bank/bank.json"
    ).is_file()


def test_every_page_the_readme_and_docs_link_to_exists():
    """The README points at docs/, lab/README.md and benchmarks/README.md for the rest; a moved
    or renamed page must not leave a dead link, nor a path in backquotes that no longer is."""
    import re

    pages = [REPO / "README.md", *(REPO / "docs").glob("*.md")]
    dead = []
    for page in pages:
        text = page.read_text()
        for target in re.findall(r"\]\(([^)#]+)\)", text):
            if not (page.parent / target).exists():
                dead.append(f"{page.name}: {target}")
        for path in re.findall(
            r"`((?:compiler|targets|ptc|lab|benchmarks|recipes|bin|docs)/[\w./-]+)`", text
        ):
            if not path.startswith("recipes/dist/") and not (REPO / path).exists():  # dist: outputs
                dead.append(f"{page.name}: {path}")
    assert dead == []
