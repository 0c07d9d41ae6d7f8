"""`ptc zoo build`: the world, then per member a pretrained model, its quality report, and a
fine-tuned source per (task, seed) whose descriptor goes into the zoo's bank.

    ROOT/zoo.json                      index: profile, members (ref, pretraining, quality), sources
    ROOT/world/                        the generated world (ptc.lab.zoo.world)
    ROOT/models/NAME/                  a member in its library's native format (zoo:NAME)
    ROOT/sources/NAME/TASK-sSEED/      a peft adapter: the member fine-tuned on TASK
    ROOT/bank/                         the zoo's bank: tasks and descriptors NAME-sSEED

Every stage's output is written atomically and a finished stage is never redone, so an
interrupted build continues where it stopped (in a later session too). zoo.json is rewritten
after every stage.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch

from ptc import targets

from ptc.compiler.bank.store import Bank
from ptc.compiler.method.descriptor import class_embeddings, normalise
from ptc.errors import InputError
from ptc.compiler.verify.evaluate import zero_shot_accuracy
from ptc.compiler.sources.finetune import finetune_lora
from ptc.files import write_json_atomic
from ptc.output_dirs import staged_directory
from ptc.compiler.tasks.grid import load_task
from ptc.compiler.sources.descriptor import add_descriptor
from ptc.lab.zoo.pretrain import pretrain
from ptc.lab.zoo.profiles import PROFILES, Member, Profile
from ptc.lab.zoo.worlds import ensure_task, world_module

INDEX = "zoo.json"
FORMAT = 1
# A task's class prompts are told apart by a text tower when their mean pairwise cosine stays
# below this; above it the classes have collapsed and no input-side edit can separate them.
MAX_PROMPT_COSINE = 0.9
LOAD_CHUNK = 1000  # pretraining inputs are preprocessed this many files at a time


def profile_named(name: str) -> Profile:
    if name not in PROFILES:
        raise InputError(f"unknown zoo profile {name!r}", f"profiles: {', '.join(PROFILES)}")
    return PROFILES[name]


def read_index(root: Path) -> dict:
    path = Path(root) / INDEX
    if not path.is_file():
        return {}
    index = json.loads(path.read_text())
    if "world" in index:  # written before worlds had these choices: theirs were plain, shared, none
        index["world"].setdefault("pretrain_style", "plain")
        index["world"].setdefault("downstream_shift", "shared")
        index["world"].setdefault("train_extra", 0)
        index["world"].setdefault("test_extra", 0)
    return index


def built_index(root: Path) -> dict:
    """The index of a zoo that must exist (`ptc zoo show`, `ptc zoo merge`)."""
    index = read_index(root)
    if not index:
        raise InputError(f"no zoo at {root} (looked for {Path(root) / INDEX})", "build one with `ptc zoo build`")
    return index


WORLD_FIELDS = ("seed", "world_kind", "world")  # the keys of world_fields


def world_fields(profile: Profile) -> dict:
    """What zoo.json records of the world a profile writes: two zoos that agree on these, and on
    the profile, hold the same splits and probes."""
    return {"seed": profile.seed, "world_kind": profile.world_kind,
            "world": {**profile.world.__dict__, "template_share": profile.template_share}}


def _builder(member: Member):
    module, _, function = member.builder.partition(":")
    return getattr(importlib.import_module(f"ptc.lab.tiny.{module}"), function)


def _task_files(root: Path) -> dict[str, Path]:
    return {p.parent.name: p for p in sorted((root / "world" / "tasks").glob("*/task.yaml"))}


def prompt_separation(encoder, task) -> float:
    """Mean off-diagonal cosine of a task's class rows (1.0: collapsed, lower: distinct)."""
    rows = normalise(class_embeddings(encoder.embed_prompts(task.prompts).double(), len(task.classes)))
    n = len(task.classes)
    return float(((rows @ rows.T).sum() - n) / (n * (n - 1)))


def member_quality(encoder, bank: Bank, files: dict[str, Path], tasks: tuple[str, ...]) -> dict:
    """Per task: held-out zero-shot accuracy against chance and prompt distinctness."""
    quality = {}
    for name in tasks:
        task = bank.task(name)
        result = zero_shot_accuracy(encoder, task, files[name].parent / "test", progress=False)
        cosine = prompt_separation(encoder, task)
        quality[name] = {"zero_shot": round(result["accuracy"], 4), "chance": round(1 / len(task.classes), 4),
                         "prompt_cosine": round(cosine, 4), "distinct": cosine <= MAX_PROMPT_COSINE}
    return quality


def _pretrain_member(member: Member, profile: Profile, root: Path, echo) -> dict:
    """Build the member's initial weights, pretrain them on the world, save natively."""
    captions = [json.loads(line) for line in (root / "world" / "pretrain" / "captions.jsonl").read_text().splitlines()]
    key = world_module(profile.world_kind).INPUT_KEY
    with tempfile.TemporaryDirectory() as scratch:
        folder = _builder(member)(Path(scratch) / "init", seed=profile.seed, **member.options)
        encoder = targets.load(f"{member.scheme}:{folder}")
    paths = [root / "world" / "pretrain" / c[key] for c in captions]
    chunks = [encoder.load_inputs(paths[i:i + LOAD_CHUNK]) for i in range(0, len(paths), LOAD_CHUNK)]
    inputs = {key: torch.cat([chunk[key] for chunk in chunks]) for key in chunks[0]}
    config = dataclasses.replace(profile.pretrain, **member.pretrain)
    start = time.perf_counter()
    trained, figures = pretrain(encoder, inputs, [c["caption"] for c in captions], config,
                                desc=f"pretrain {member.name}")
    figures["seconds"] = round(time.perf_counter() - start, 1)
    with staged_directory(root / "models" / member.name, replace=False, unmarked=True) as staging:
        scheme = trained.save_native(staging)
    echo(f"  {member.name}: pretrained {config.steps} steps in {figures['seconds']:.0f}s on {figures['device']}, "
         f"final loss {figures['final_loss']:.3f}")
    return {"ref": f"{scheme}:models/{member.name}", "builder": member.builder, "options": member.options,
            "pretrain": figures}


def _descriptor_current(bank: Bank, task: str, descriptor_id: str) -> bool:
    """Present and carrying the source's affinities (descriptors made before ptc 0.2 lack them)."""
    return (descriptor_id in bank.descriptor_ids(task)
            and "source_affinity" in bank.descriptor(task, descriptor_id).tensors)


def _sources(member: Member, encoder, profile: Profile, root: Path, bank: Bank, files, record: dict, echo,
             save: Callable[[], None]) -> None:
    """Fine-tune one source per (task, seed) and store its descriptor; skip finished ones.
    `save` writes the index after each source it records: a build stopped mid-way keeps every
    finished source's record (its fine-tuning figures exist nowhere else)."""
    plan = [(t, profile.seeds) for t in profile.source_tasks] + [(t, profile.seeds[:1])
                                                                  for t in profile.in_distribution_tasks]
    for task_name, seeds in plan:
        task = bank.task(task_name)
        for seed in seeds:
            key = f"{task_name}-s{seed}"
            entry = record.setdefault("sources", {}).setdefault(key, {})
            recorded = dict(entry)
            adapter = root / "sources" / member.name / key
            descriptor_id = f"{member.name}-s{seed}"
            if not (adapter / "adapter_config.json").is_file():
                stats = finetune_lora(encoder, task, files[task_name].parent / "train", adapter,
                                      rank=profile.finetune_rank, alpha=2 * profile.finetune_rank,
                                      steps=profile.finetune_steps, seed=seed, dropout=profile.finetune_dropout,
                                      progress=True,
                                      base_ref=record["ref"])  # root-relative: stays true when the zoo moves
                entry["finetune"] = {k: round(v, 4) if isinstance(v, float) else v for k, v in stats.items()}
            if not _descriptor_current(bank, task_name, descriptor_id):
                add_descriptor(bank, task_name, record["ref"], str(adapter.relative_to(root)), descriptor_id,
                               base_dir=root, progress=False, source=encoder)
            if "finetuned_zero_shot" not in entry:
                tuned = encoder.with_adapter(adapter)
                result = zero_shot_accuracy(tuned, task, files[task_name].parent / "test", progress=False)
                entry.update(adapter=str(adapter.relative_to(root)), descriptor=descriptor_id,
                             finetuned_zero_shot=round(result["accuracy"], 4))
                gain = entry["finetuned_zero_shot"] - record["quality"][task_name]["zero_shot"]
                echo(f"  {member.name} {key}: fine-tuned {entry['finetuned_zero_shot']:.3f} ({gain:+.3f})")
            if entry != recorded:
                save()


def write_world_once(root: Path, profile: Profile, echo: Callable[[str], None] = print) -> None:
    """The profile's world under root/world (world.json last: its presence means the world is
    whole), then any task split it lacks (tasks added since, or splits not committed)."""
    if not (root / "world" / "world.json").is_file():
        echo(f"world ({profile.world_kind}): {profile.world.pretrain} captioned inputs, {len(profile.tasks)} tasks "
             f"-> {root / 'world'}")
        world_module(profile.world_kind).write_world(root / "world", profile.world, profile.seed, profile.template_share)
        write_json_atomic(root / "world" / "world.json", world_fields(profile)["world"])
    for name in (*profile.tasks, *profile.in_distribution_tasks):
        if ensure_task(root / "world", profile.world_kind, profile.world, profile.seed, name):
            echo(f"world: task {name}")


def build_zoo(root: Path, profile: Profile, echo: Callable[[str], None] = print,
              members: tuple[str, ...] | None = None) -> dict:
    """Build (or continue building) the zoo under `root`; returns the index."""
    root = Path(root)
    index = read_index(root)
    if index and index.get("profile") != profile.name:
        raise InputError(f"{root / INDEX}: this zoo was built with profile {index.get('profile')!r}, "
                         f"not {profile.name!r}", "build into another folder, or delete this one")
    # The world is written once: a profile whose world settings changed since (more probes, another
    # seed) would otherwise be recorded over a world that still holds the old splits.
    wanted = world_fields(profile)
    for field, value in wanted.items():
        if index and index.get(field) != value:
            raise InputError(f"{root / INDEX}: this zoo's {field} is {index.get(field)!r}; the {profile.name} "
                             f"profile now says {value!r}", "build into another folder (--root DIR), or delete "
                             "this one to write its world and members again")
    world = world_module(profile.world_kind)
    index.update({"format": FORMAT, "profile": profile.name, **wanted,
                  "tasks": list(profile.tasks), "control_tasks": list(profile.control_tasks),
                  "in_distribution_tasks": list(profile.in_distribution_tasks),
                  "seeds": list(profile.seeds)})
    index.setdefault("members", {})
    root.mkdir(parents=True, exist_ok=True)
    write_world_once(root, profile, echo)
    all_tasks = (*profile.tasks, *profile.in_distribution_tasks)
    files = {name: path for name, path in _task_files(root).items() if name in all_tasks}
    bank = Bank(root / "bank")
    for name in all_tasks:
        bank.add_task(load_task(files[name]))
    for member in profile.members:
        if members and member.name not in members:
            continue
        record = index["members"].get(member.name)
        if record is None or not (root / "models" / member.name).is_dir():
            if not (root / "world" / "pretrain" / "captions.jsonl").is_file():  # not committed: written again
                echo(f"world ({profile.world_kind}): {profile.world.pretrain} captioned inputs")
                world.write_world(root / "world", profile.world, profile.seed, profile.template_share)
            echo(f"member {member.name} ({member.builder})")
            record = _pretrain_member(member, profile, root, echo)
            index["members"][member.name] = record
            write_json_atomic(root / INDEX, index)
        encoder = targets.load(record["ref"], root)
        missing = tuple(t for t in all_tasks if t not in record.get("quality", {}))
        if missing:
            record.setdefault("quality", {}).update(member_quality(encoder, bank, files, missing))
            write_json_atomic(root / INDEX, index)
        _sources(member, encoder, profile, root, bank, files, record, echo,
                 save=lambda: write_json_atomic(root / INDEX, index))
        write_json_atomic(root / INDEX, index)  # the profile's fields too, when no source changed
    return index


def quality(index: dict) -> list[dict]:
    """The zoo's own quality report, one record per (member, task)."""
    rows = []
    for name, record in index.get("members", {}).items():
        for task, q in record.get("quality", {}).items():
            tuned = [s["finetuned_zero_shot"] for key, s in record.get("sources", {}).items()
                     if key.startswith(f"{task}-s") and "finetuned_zero_shot" in s]
            rows.append({"member": name, "task": task, "zero_shot": q["zero_shot"], "chance": q["chance"],
                         "prompt_cosine": q["prompt_cosine"], "distinct": q["distinct"],
                         "finetuned_zero_shot": sum(tuned) / len(tuned) if tuned else None})
    return rows


def quality_rows(index: dict) -> list[str]:
    """The quality report as an aligned table with a header row."""
    from ptc.compiler.cli.tables import table

    return table([("MEMBER", "TASK", "ZERO-SHOT", "CHANCE", "PROMPT COSINE", "FINE-TUNED", "NOTE")] + [
        (r["member"], r["task"], f"{r['zero_shot']:.3f}", f"{r['chance']:.3f}", f"{r['prompt_cosine']:.3f}",
         "control" if r["finetuned_zero_shot"] is None else f"{r['finetuned_zero_shot']:.3f}",
         "" if r["distinct"] else "COLLAPSED") for r in quality(index)])


def collapsed(index: dict) -> list[str]:
    """(member/task) pairs whose class prompts the member's text tower cannot tell apart."""
    return [f"{name}/{task}" for name, record in index.get("members", {}).items()
            for task, q in record.get("quality", {}).items() if not q["distinct"]]
