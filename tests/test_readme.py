"""The README's worked example is recipes/example.sh: the README holds its text, and the
script runs as written, end to end, on the committed zoo's models (trained here)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

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


def _shipping() -> str:
    readme = (REPO / "README.md").read_text()
    return readme.split("## Shipping\n", 1)[1].split("\n## ", 1)[0]


def test_every_line_of_the_shipping_section_runs_on_a_built_output(world, built, tmp_path):
    """The table's loading lines and the Triton request, each as written, with the README's
    placeholders (OUT, the zoo's task, cat.jpg) pointed at a built output and the test world;
    the request goes to a stand-in server that holds it to config.pbtxt and runs the
    repository's graph (tests/triton_fake.py)."""
    import re

    import numpy as np

    from ptc import targets
    from ptc.compiler.export.triton import write_triton_model
    from ptc.lab.tiny import openclip

    out = tmp_path / "out"
    shutil.copytree(built[0], out)
    for graph in sorted((out / "onnx").glob("*.onnx")):
        write_triton_model(out / "triton", graph.stem, graph, max_batch_size=8)
    open_clip_out = tmp_path / "oc"  # a build's model/ folder is what save_native writes
    folder = openclip.build_tiny(tmp_path / "oc-base", width=32, embed_dim=20, seed=2)
    targets.load(f"open_clip:local-dir:{folder}").save_native(open_clip_out / "model")
    image = sorted((world.tasks["colour"].parent / "test").rglob("*.png"))[0]
    data = world.tasks["colour"].parent / "test"

    def pointed(line: str, output: Path) -> str:
        for placeholder, real in (
            ("zoo/world/tasks/colour/test", data),
            ("zoo/bank", world.bank),
            ("cat.jpg", image),
            ("OUT", output),
        ):
            line = line.replace(placeholder, str(real))
        return line

    section = _shipping()
    rows = [r for r in section.splitlines() if r.startswith("| ") and "`" in r.split("|")[2]]
    assert len(rows) == 7
    for row in rows:
        consumer, line = row.split("|")[1].strip(), row.split("|")[2].split("`")[1]
        output = open_clip_out if consumer == "open_clip" else out
        if line.startswith("tritonserver"):
            continue  # no tritonserver here: the request below is run against its stand-in
        if line.startswith("ptc "):
            command = pointed(line, output).split()
            result = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
        else:
            code = pointed(line, output)
            result = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path
            )
        assert result.returncode == 0, f"{consumer}: {line}\n{result.stderr[-2000:]}"
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    saved = tmp_path / "served.npz"
    stand_in = (
        "import sys, tritonclient.http\n"
        f"sys.path.insert(0, {str(REPO / 'tests')!r})\n"
        "from triton_fake import FakeTriton\n"
        f"tritonclient.http.InferenceServerClient = lambda url: FakeTriton({str(out / 'triton')!r})\n"
    )
    keep = f"\nimport numpy\nnumpy.savez({str(saved)!r}, image=image_embeds, text=text_embeds)\n"
    result = subprocess.run(
        [sys.executable, "-c", stand_in + pointed(block, out) + keep],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    served = np.load(saved)
    edited = targets.load(f"hf:{out / 'model'}")
    assert (
        np.abs(served["image"] - edited.embed_inputs(edited.load_inputs([image])).numpy()).max()
        <= 1e-5
    )
    assert np.abs(served["text"] - edited.embed_prompts(["a photo of a cat"]).numpy()).max() <= 1e-5
