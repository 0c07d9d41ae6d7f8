"""Executing a planned build: each stage takes the previous stage's result and returns its own
(stages.py), and only a build whose every check passed is written (outputs.py)."""

from __future__ import annotations

from ptc.compiler.build.outputs import update_recipe_lock, write_output
from ptc.compiler.build.report import BuildReport, Exported, build_report, run_record
from ptc.compiler.build.stages import check_edit, load_target, make_edit
from ptc.compiler.edit.routes import Run
from ptc.compiler.recipe.options import Options
from ptc.compiler.recipe.plan import Plan
from ptc.errors import OutputError


def execute(plan: Plan, options: Options = Options()) -> BuildReport:
    """Load the target, make the recipe's edit, check it, and write it (unless --no-export)."""
    if plan.out_dir is None and options.export:
        raise OutputError(
            f"{plan.recipe_path}: export.out: no output directory",
            "set export.out in the recipe or pass --out",
        )
    run = Run()
    target = load_target(plan, options, run)
    edited = make_edit(plan, target, options, run)
    checked = check_edit(edited, target, options, run)
    if not options.export:  # verified up to the exports; nothing is written
        report = build_report(target, edited, checked, Exported())
        report.run = run_record(run, edited.plan)
        return report
    written = write_output(target, edited, checked, options, run)
    report = written.report
    report.recipe_lock = None if options.locked else update_recipe_lock(plan, written.lock)
    report.out_dir = plan.out_dir
    return report
