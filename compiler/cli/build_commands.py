"""`ptc check`, `build`, `lock`, `verify`, `diff`, `certify` and `eval`: recipes and what they
build."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from ptc.compiler.cli.app import JSON_FLAG, compute_of, handled, main, open_bank_at, options
from ptc.compiler.cli.flags import flag


# -- recipes --------------------------------------------------------------------------------------
@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@options("bank", "out")
@JSON_FLAG
@handled
def check(recipe: Path, bank: Path | None, out: Path | None, as_json: bool) -> None:
    """Validate RECIPE and resolve every term against the bank, loading no weights."""
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan

    # check writes nothing: an existing output is fine
    p = plan(recipe, Options(bank=bank, out=out, export=False))
    if as_json:
        click.echo(
            json.dumps(
                {
                    "recipe": str(p.recipe_path),
                    "target": p.recipe.target,
                    "target_location": str(p.target_location),
                    "route": p.recipe.route,
                    "bank": str(p.bank.root),
                    "output": str(p.out_dir) if p.out_dir else None,
                    "terms": [
                        {
                            "task": pt.term.task,
                            "source": pt.term.label,
                            "weight": pt.term.weight,
                            "sources": list(pt.term.sources),
                            "probes": len(pt.task.probes),
                            "classes": len(pt.task.classes),
                            "grid": pt.task.grid_hash,
                        }
                        for pt in p.terms
                    ],
                },
                indent=2,
            )
        )
        return
    click.echo(f"target {p.recipe.target} -> {p.target_location}")
    click.echo(f"route {p.recipe.route}")
    for pt in p.terms:
        weighting = f", {pt.term.weighting} weights" if pt.term.weighting else ""
        kind = (
            ""
            if len(pt.term.sources) == 1
            else f", {pt.term.combine} of {len(pt.term.sources)}{weighting}"
        )
        click.echo(
            f"  {pt.term.weight:+g} x {pt.term.task}/{pt.term.label}{kind}  "
            f"({len(pt.task.probes)}x{len(pt.task.classes)}, grid {pt.task.grid_hash[:12]})"
        )
    click.echo(f"bank {p.bank.root}; output {p.out_dir or '(none: set export.out or --out)'}")
    click.echo("ok")


@main.command()
@click.argument("recipe", type=click.Path(path_type=Path))
@options(
    "bank", "out", "force", "batch_size", "device", "precision", "embed_runtime", "export", "locked"
)
@JSON_FLAG
@handled
def build(
    recipe: Path,
    bank: Path | None,
    out: Path | None,
    force: bool,
    batch_size: int,
    device: str,
    precision: str,
    embed_runtime: str,
    export: bool,
    locked: bool,
    as_json: bool,
) -> None:
    """Build RECIPE: solve, fold, verify, export; then record the build in RECIPE.lock."""
    from ptc.compiler.build.pipeline import execute
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan
    from ptc.progress import verbose

    options = Options(
        bank=bank,
        out=out,
        force=force,
        batch_size=batch_size,
        device=device,
        precision=precision,
        embed_runtime=embed_runtime,
        export=export,
        locked=locked,
    )
    p = plan(recipe, options)
    report = execute(p, options)
    # report.json's content, where it went, this run's record and what happened to the lock
    if as_json:
        click.echo(
            json.dumps(
                {
                    "out": str(report.out_dir) if report.out_dir else None,
                    "report": report.to_json(),
                    "run": report.run,
                    "recipe_lock": report.recipe_lock,
                },
                indent=2,
                default=str,
            )
        )
        return
    for line in report.summary_lines():
        click.echo(line)
    if verbose():
        timings = report.run.get("timings", {})
        click.echo(
            "stages: " + ", ".join(f"{stage} {seconds:.2f}s" for stage, seconds in timings.items())
        )


@main.command("lock")
@click.argument("recipe", type=click.Path(path_type=Path))
@options("bank")
@flag("--lock-file", type=click.Path(path_type=Path), default=None)
@handled
def lock_command(recipe: Path, bank: Path | None, lock_file: Path | None) -> None:
    """Write RECIPE's lock without building: every input's fingerprint, the settings and versions."""
    from ptc import targets
    from ptc.compiler.recipe.lock import (
        lock_document,
        lock_inputs,
        previous_lock,
        recipe_lock_path,
        write_recipe_lock,
    )
    from ptc.compiler.recipe.options import Options
    from ptc.compiler.recipe.plan import plan

    p = plan(recipe, Options(bank=bank, export=False))
    path = lock_file or recipe_lock_path(p.recipe_path)
    before = previous_lock(path)
    document = lock_document(lock_inputs(p, targets.load(p.recipe.target, p.base_dir)))
    if before is not None and before["inputs"] == document["inputs"]:
        click.echo(f"lock {path}: unchanged ({document['lock_hash'][:12]})")
        return
    write_recipe_lock(path, document)
    click.echo(
        f"lock {path}: written ({document['lock_hash'][:12]}; outputs are recorded by `ptc build`)"
    )


@main.command("verify")
@click.argument("output", type=click.Path(path_type=Path))
@flag("--lock-file", type=click.Path(path_type=Path), default=None)
@JSON_FLAG
@handled
def verify_command(output: Path, lock_file: Path | None, as_json: bool) -> None:
    """Re-hash OUTPUT against its lock and check its report's figures; exit 0 only if all hold."""
    from ptc.compiler.recipe.lock import verify_output

    checked, problems = verify_output(output, lock_file)
    if as_json:
        click.echo(
            json.dumps({"output": str(output), "files": checked, "problems": problems}, indent=2)
        )
    else:
        for problem in problems:
            click.echo(f"{output}/{problem}", err=True)
        click.echo(f"{output}: {checked} files checked, {len(problems)} problems")
    if problems:
        sys.exit(3)


@main.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@JSON_FLAG
@handled
def diff_command(a: Path, b: Path, as_json: bool) -> None:
    """What differs between two locks or two output folders: terms, weights, fingerprints,
    settings, versions, outputs."""
    from ptc.compiler.recipe.lock import describe, differences, load_lock_or_output

    found = [
        d
        for d in differences(load_lock_or_output(a), load_lock_or_output(b))
        if d["path"] != "seal"
    ]
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    for difference in found:
        click.echo(describe(difference))
    click.echo(f"{len(found)} difference(s)" if found else "identical")


@main.command()
@click.argument("output", type=click.Path(path_type=Path))
@flag("--data", type=click.Path(path_type=Path), required=True)
@flag("--task", "task_name", default=None)
@options("batch_size", "device", "precision")
@JSON_FLAG
@handled
def certify(
    output: Path,
    data: Path,
    task_name: str | None,
    batch_size: int,
    device: str,
    precision: str,
    as_json: bool,
) -> None:
    """Composition certificate of a built OUTPUT: inputs whose prediction provably equals the
    single-task model's, whatever the other terms do."""
    from ptc.compiler.verify.certify import certify_output

    if not data.is_dir():
        from ptc.errors import RecipeError

        raise RecipeError(
            f"--data: {data} is not a folder", "give a folder of input files (subfolders are read)"
        )
    figures = certify_output(
        output, data, task_name, batch_size, compute=compute_of(device, precision)
    )
    if as_json:
        click.echo(json.dumps(figures, indent=2))
        return
    click.echo(
        f"{figures['task']}: {figures['certified']}/{figures['inputs']} certified "
        f"({figures['certified_fraction']:.1%}); certified changed {figures['certified_changed']}, "
        f"changed in all {figures['changed']}"
    )


# -- evaluation, fine-tuning, bank ----------------------------------------------------------------
@main.command("eval")
@click.argument("model")
@flag("--task", "task_name", required=True)
@flag("--data", type=click.Path(path_type=Path), required=True)
@flag("--runtime", type=click.Choice(["torch", "onnx"]), default="torch", show_default=True)
@JSON_FLAG
@options("batch_size", "device", "precision", "bank")
@handled
def eval_command(
    model: str,
    task_name: str,
    data: Path,
    runtime: str,
    as_json: bool,
    batch_size: int,
    device: str,
    precision: str,
    bank: Path | None,
) -> None:
    """Zero-shot top-1 accuracy of MODEL (a reference or a build output folder); with
    --runtime onnx, of a build output's shipped graphs, as a serving host runs them."""
    if runtime == "onnx" and precision != "fp32":
        from ptc.errors import RecipeError

        raise RecipeError(
            f"--precision {precision}: the onnx runtime runs the graphs as shipped",
            "drop --precision, or evaluate the checkpoint with --runtime torch",
        )
    task = open_bank_at(bank).task(task_name)
    if runtime == "onnx":
        result = _eval_onnx(
            model, task.name, list(task.classes), list(task.prompts), data, batch_size
        )
    else:
        from ptc.compiler.verify.evaluate import evaluate

        result = dict(
            evaluate(model, task, data, batch_size, compute=compute_of(device, precision))
        )
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        click.echo(
            f"{task_name}: top-1 {result['accuracy']:.4f} ({result['correct']}/{result['total']})"
        )


def _eval_onnx(
    model: str, task: str, classes: list[str], prompts: list[str], data: Path, batch_size: int
) -> dict[str, object]:
    """The ONNX-only client's zero-shot accuracy: a serving host's check of what it loaded."""
    from ptc.compiler.serve.client import OnnxClient
    from ptc.compiler.serve.zero_shot import zero_shot_accuracy

    client = OnnxClient(Path(model).expanduser())
    accuracy = zero_shot_accuracy(client, task, classes, prompts, data, batch_size)
    return {"model": model, "runtime": "onnx", **accuracy}
