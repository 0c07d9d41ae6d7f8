"""Bad input through the real CLI: one line on stderr, exit code 2 (3 for a failed
verification), nothing written."""

import shutil

import pytest
import torch
import yaml

from conftest import run_ptc, write_recipe
from ptc.compiler.bank.store import Bank


def _one_line_error(result, code, *fragments):
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("ptc: error: ")
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def test_check_resolves_a_good_recipe_without_building(world, tmp_path):
    result = run_ptc("check", write_recipe(tmp_path / "recipe.yaml", world))
    assert result.returncode == 0, result.stderr
    assert "+0.5 x colour/src" in result.stdout and "-1 x shape/src" in result.stdout
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "terms,fragments",
    [
        (
            [{"task": "colour", "source": "src", "wieght": 0.5}],
            ["recipe.yaml:", "terms[0].wieght", "did you mean 'weight'"],
        ),
        (
            [{"task": "texture", "source": "src", "weight": 0.5}],
            ["terms[0]: task 'texture' is not registered", "register it with `ptc task add"],
        ),
        (
            [{"task": "colour", "source": "srcc", "weight": 0.5}],
            ["terms[0]: no descriptor 'srcc' for task 'colour'", "did you mean 'src'"],
        ),
    ],
)
def test_check_catches_bad_terms_in_one_line(world, tmp_path, terms, fragments):
    result = run_ptc("check", write_recipe(tmp_path / "recipe.yaml", world, terms=terms))
    _one_line_error(result, 2, *fragments)


def test_an_unknown_evaluation_task_names_its_line_and_the_task_it_may_have_meant(world, tmp_path):
    recipe = write_recipe(
        tmp_path / "recipe.yaml",
        world,
        evaluate={
            "colour": str(world.tasks["colour"].parent / "test"),
            "shapes": str(world.tasks["shape"].parent / "test"),
        },
    )
    line = next(
        i
        for i, text in enumerate(recipe.read_text().splitlines(), 1)
        if text.strip().startswith("shapes:")
    )
    result = run_ptc("check", recipe)
    _one_line_error(
        result,
        2,
        f"recipe.yaml:{line}: evaluate.shapes: task 'shapes' is not registered",
        "did you mean 'shape'?",
    )


def test_debug_shows_the_traceback(world, tmp_path):
    recipe = write_recipe(
        tmp_path / "recipe.yaml", world, terms=[{"task": "texture", "source": "src", "weight": 1.0}]
    )
    result = run_ptc("--debug", "check", recipe)
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_missing_target_says_where_it_looked(world, tmp_path):
    recipe = write_recipe(
        tmp_path / "recipe.yaml", world, target=f"hf:{tmp_path / 'no-such-model'}"
    )
    _one_line_error(run_ptc("check", recipe), 2, "target: hf:", "looked at", "Hugging Face cache")
    recipe = write_recipe(tmp_path / "recipe.yaml", world, target=str(world.target))
    _one_line_error(run_ptc("check", recipe), 2, "no known scheme", f"hf:{world.target}")


def test_pickle_checkpoint_is_refused(world, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    shutil.copy(world.target / "config.json", folder / "config.json")
    torch.save({"x": torch.zeros(1)}, folder / "pytorch_model.bin")
    recipe = write_recipe(tmp_path / "recipe.yaml", world, target=f"hf:{folder}")
    _one_line_error(run_ptc("check", recipe), 2, "only pickle weights", "never unpickles")


def test_existing_output_needs_force(world, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("precious")
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    _one_line_error(run_ptc("build", recipe), 2, "exists and is not empty", "--force")
    assert (out / "keep.txt").read_text() == "precious" and len(list(out.iterdir())) == 1


def test_failed_verification_writes_nothing_and_reports_the_figure(world, tmp_path):
    recipe = write_recipe(tmp_path / "recipe.yaml", world, verify={"equivalence_atol": 1.0e-30})
    # -q: whether the grids' embeddings are cached yet depends on the tests run before this one
    # (and on which worker runs it); uncached, their progress lines would precede the error.
    result = run_ptc("-q", "build", recipe)
    _one_line_error(result, 3, "verification failed", "exceeds the tolerance 1.0e-30")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml"]  # no output, no staging


def test_changed_probes_are_caught_before_loading(world, tmp_path):
    task_dir = tmp_path / "task"
    shutil.copytree(world.tasks["colour"].parent / "probes", task_dir / "probes")
    spec = yaml.safe_load(world.tasks["colour"].read_text())
    (task_dir / "task.yaml").write_text(yaml.safe_dump({**spec, "name": "colour2"}))
    bank = tmp_path / "bank"
    assert run_ptc("task", "add", task_dir / "task.yaml", "--bank", bank).returncode == 0
    first = next((task_dir / "probes").iterdir())
    first.write_bytes(next((world.tasks["shape"].parent / "probes").iterdir()).read_bytes())
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "colour2",
        "--source",
        f"hf:{world.source}",
        "--finetuned",
        world.adapters["colour"],
        "--bank",
        bank,
    )
    _one_line_error(result, 2, "probe files changed since it was registered", "--replace")
    _one_line_error(
        run_ptc("task", "add", task_dir / "task.yaml", "--bank", bank),
        2,
        "already registered with another grid",
        "--replace",
    )
    assert (
        run_ptc("task", "add", task_dir / "task.yaml", "--bank", bank, "--replace").returncode == 0
    )


def test_finetune_that_touches_the_text_tower_is_refused(world, bank_copy, tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import CLIPModel

    model = CLIPModel.from_pretrained(world.source)
    # init_lora_weights=False: a fresh LoRA is otherwise a no-op, and this one must change weights.
    config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(tmp_path / "both-towers")
    result = run_ptc(
        "descriptor",
        "add",
        "--task",
        "colour",
        "--source",
        f"hf:{world.source}",
        "--finetuned",
        tmp_path / "both-towers",
        "--id",
        "both",
        "--bank",
        bank_copy,
    )
    _one_line_error(result, 2, "changed the text tower", "frozen text tower")
    assert Bank(bank_copy).descriptor_ids("colour") == ["full", "src"]


def test_tampered_bank_entry_is_detected(world, bank_copy, tmp_path):
    entry = bank_copy / "descriptors" / "colour" / "src.safetensors"
    data = bytearray(entry.read_bytes())
    data[-3] ^= 0xFF  # flip bits inside the tensor payload
    entry.write_bytes(bytes(data))
    recipe = write_recipe(tmp_path / "recipe.yaml", world, bank=str(bank_copy))
    _one_line_error(run_ptc("check", recipe), 2, "failed its integrity check")
    result = run_ptc("bank", "verify", "--bank", bank_copy)
    assert result.returncode == 2 and "1 problems" in result.stdout
    entry.write_bytes(bytes(data[:40]))  # truncated
    _one_line_error(run_ptc("check", recipe), 2, "is corrupt")


def test_bank_location_precedence(world, tmp_path):
    """--bank wins over the recipe's bank:, which wins over $PTC_BANK."""
    recipe = write_recipe(tmp_path / "recipe.yaml", world)
    env = {"PTC_BANK": str(tmp_path / "env-bank")}
    assert f"bank {world.bank}" in run_ptc("check", recipe, env=env).stdout
    _one_line_error(
        run_ptc("check", recipe, "--bank", tmp_path / "empty", env=env), 2, "not registered"
    )
    listing = run_ptc("task", "list", env={"PTC_BANK": str(world.bank)})
    assert listing.returncode == 0 and "colour" in listing.stdout and "full, src" in listing.stdout


def test_empty_output_folder_is_used(world, tmp_path):
    (tmp_path / "out").mkdir()
    result = run_ptc("build", write_recipe(tmp_path / "recipe.yaml", world))
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "report.json").is_file()
