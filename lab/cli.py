"""The lab's commands (`ptc zoo`, `ptc paper`, `ptc bench`, `ptc demo`), plugged into the
product's CLI through its `ptc.commands` entry point, as a third party's would be."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from ptc.compiler.cli.app import JSON_FLAG, handled  # the product's one-line error handling
from ptc.compiler.cli.flags import flag as product_flag

# The lab's own flags, with the one help each has in every lab command (the product's table,
# compiler/cli/flags.py, holds the flags both share: --out, --steps, --json).
LAB_FLAGS = {
    "--profile": "The zoo's profile: full (the image zoo), audio (the CLAP zoo), tiny and audio-tiny (test size).",
    "--root": "Zoo folder (default: the profile's, under $PTC_ZOO or the repository's zoo/; for paper, a "
    "test-size profile's under OUT).",
    "--member": "Only this member (repeatable).",
    "--split": "What to score: the held-out test splits (the report), or the train splits, to judge a change "
    "to the zoo before its test figures are seen (written as paper-PROFILE-train).",
    "--quick": "CI-size run (under 5 minutes on 2 cores): one target, the medians of 3 bank builds.",
    "--smoke": "Every section once at the least work that yields its figures (about 30 s at "
    "--size tiny): shows the bench runs end to end; its ratios are not measurements.",
    "--size": "Model and grid size (default: small with --quick or --smoke, vit-b otherwise). vit-b16, vit-l14, eva02-l14, "
    "siglip-so400m and vit-h14 build at those real architectures' sizes (vit-tiny16: the same at tiny "
    "cost) and hold the build to its floors.",
    "--workdir": "Folder the demo writes its world, models, bank and output into.",
}


flag = functools.partial(product_flag, table=LAB_FLAGS)  # the lab's help, else the product's

COMMANDS: list = []  # (decorated command or group), added to the product's group by register()


def _lab(make):
    """`@_lab(click.group)` / `@_lab(click.command)`: a command of the lab's, kept for register()."""

    def decorate(function):
        command = make()(function)
        COMMANDS.append(command)
        return command

    return decorate


def register(main: click.Group) -> None:
    """Entry point of `ptc.commands`: add the lab's commands to ptc's group."""
    for command in COMMANDS:
        main.add_command(command)


# -- the offline zoo ------------------------------------------------------------------------------
@_lab(click.group)
def zoo() -> None:
    """Build and inspect the offline zoo (models pretrained here on a generated world)."""


def _zoo_dir(root: Path | None, profile: str = "full") -> Path:
    """--root, else the profile's folder under $PTC_ZOO or the repository's zoo/."""
    from ptc.lab.zoo.profiles import PROFILES
    from ptc.lab.zoo_scheme import zoo_root

    return root or zoo_root() / PROFILES[profile].folder


def _profiles() -> list[str]:
    from ptc.lab.zoo.profiles import PROFILES

    return list(PROFILES)


@zoo.command("build")
@flag("--profile", type=click.Choice(_profiles()), default="full", show_default=True)
@flag("--root", type=click.Path(path_type=Path), default=None)
@flag("--member", "members", multiple=True)
@handled
def zoo_build(profile: str, root: Path | None, members: tuple[str, ...]) -> None:
    """Build the zoo, or continue an interrupted build where it stopped."""
    from ptc.lab.zoo.build import build_zoo, collapsed, profile_named, quality_rows

    root = _zoo_dir(root, profile)
    index = build_zoo(root, profile_named(profile), echo=click.echo, members=members or None)
    for row in quality_rows(index):
        click.echo(row)
    broken = collapsed(index)
    if broken:
        click.echo(
            f"warning: class prompts collapsed on {', '.join(broken)}: those tasks cannot be edited "
            "on those members",
            err=True,
        )
    click.echo(f"zoo ({profile}) at {root}: {len(index['members'])} members")


@zoo.command("merge")
@click.argument("source", type=click.Path(path_type=Path))
@flag("--member", "members", multiple=True, required=True)
@flag("--root", type=click.Path(path_type=Path), default=None)
@handled
def zoo_merge(source: Path, members: tuple[str, ...], root: Path | None) -> None:
    """Take members built in another copy of this zoo (model, sources, descriptors, record)."""
    from ptc.lab.zoo.merge import merge_members

    root = _zoo_dir(root)
    for name in merge_members(root, source, members):
        click.echo(f"zoo:{name} <- {source}")


@zoo.command("show")
@flag("--root", type=click.Path(path_type=Path), default=None)
@JSON_FLAG
@handled
def zoo_show(root: Path | None, as_json: bool) -> None:
    """Print the zoo's quality report: zero-shot against chance, prompt distinctness, fine-tunes."""
    import json

    from ptc.lab.zoo.build import built_index, quality, quality_rows

    index = built_index(_zoo_dir(root))
    if as_json:
        click.echo(json.dumps(quality(index), indent=2))
        return
    for row in quality_rows(index):
        click.echo(row)


@_lab(click.command)
@flag("--profile", type=click.Choice(_profiles()), default="full", show_default=True)
@flag("--root", type=click.Path(path_type=Path), default=None)
@flag("--out", type=click.Path(path_type=Path), default=Path("results"), show_default=True)
@flag("--split", type=click.Choice(["test", "train"]), default="test", show_default=True)
@handled
def paper(profile: str, root: Path | None, out: Path, split: str) -> None:
    """Run the paper's experiments on the zoo; write OUT/paper-PROFILE.{json,md} and plots."""
    from ptc.lab.zoo import paper as harness
    from ptc.lab.zoo import report
    from ptc.lab.zoo.build import build_zoo, profile_named, read_index

    scratch = profile_named(profile).scratch
    root = root or (out / f"zoo-{profile}" if scratch else _zoo_dir(None, profile))
    # a zoo named by --root is run as it was built
    profile = read_index(root).get("profile", profile)
    # A finished zoo is left as it is, except for the splits it does not commit (written again).
    build_zoo(root, profile_named(profile), echo=click.echo)
    results = harness.run(root, echo=click.echo, split=split)
    written = report.write(
        results, out, f"paper-{profile}" + ("-train" if split == "train" else "")
    )
    for line in report.findings(results):
        click.echo(line)
    click.echo(f"written: {', '.join(str(p) for p in written)}")


REAL_SIZES = ("vit-tiny16", "vit-b16", "vit-l14", "eva02-l14", "siglip-so400m", "vit-h14")


@_lab(click.command)
@flag("--quick", is_flag=True)
@flag("--smoke", is_flag=True)
@flag("--size", type=click.Choice(["tiny", "small", "vit-b", *REAL_SIZES]), default=None)
@flag("--out", type=click.Path(path_type=Path), default=None)  # benchmarks/results[-SIZE].json
@handled
def bench(quick: bool, smoke: bool, size: str | None, out: Path | None) -> None:
    """Measure the build against its floor; print a table and write JSON."""
    from ptc.errors import InputError
    from ptc.files import write_json_atomic

    if quick and smoke:
        raise InputError("--quick and --smoke each set the effort", hint="give one")
    if size in REAL_SIZES:
        if quick or smoke:
            raise InputError(
                f"--size {size} runs its one real-size measurement", hint="drop --quick/--smoke"
            )
        from ptc.lab.benchmarks import real_size as bench_module

        results = bench_module.run(size, echo=lambda m: click.echo(m, err=True))
        out = out or Path(f"benchmarks/results-{size}.json")
    else:
        from ptc.lab.benchmarks import suite as bench_module

        effort = "smoke" if smoke else "quick" if quick else "full"
        results = bench_module.run(
            effort,
            size or ("vit-b" if effort == "full" else "small"),
            echo=lambda m: click.echo(m, err=True),
        )
        out = out or Path("benchmarks/results.json")
    write_json_atomic(out, results)
    rows = bench_module.summary_rows(results)
    width = max(len(r[0]) for r in rows)
    for name, measured, target in rows:
        click.echo(f"{name:<{width}}  {measured:<48} {target}")
    click.echo(
        f"machine: {results['machine'].get('cpu') or results['machine']['processor']}, "
        f"{results['machine']['cpus']} CPUs, "
        f"cuda {results['machine']['cuda']}; written to {out}"
    )


@_lab(click.command)
@flag("--workdir", type=click.Path(path_type=Path), default=Path("ptc-demo"), show_default=True)
@flag("--steps", type=click.IntRange(min=1), default=60, show_default=True)  # each source's LoRA
@handled
def demo(workdir: Path, steps: int) -> None:
    """Run the built-in offline default end to end (tiny generated world and models)."""
    from ptc.lab.demo import run_demo

    report = run_demo(workdir, steps=steps, echo=click.echo)
    lin, eq = report.verify["linearity"], report.verify["equivalence"]
    click.echo(
        f"verified: linearity fp64 {lin['max_rel_diff_fp64']:.1e} / fp32 {lin['max_rel_diff_fp32']:.1e}, "
        f"onnx {eq['onnx_max_abs_diff']:.1e}, reload {eq['reload_max_abs_diff']:.1e}"
    )
    click.echo(f"output: {Path(workdir).resolve() / 'dist' / 'target-edit'}")
