"""Recipe and task files: strict validation, one line naming file, line and field."""

import pytest

from ptc.compiler.recipe.schema import load_recipe
from ptc.compiler.tasks.grid import grid_hash, load_task
from ptc.errors import RecipeError, TaskError

GOOD = """target: hf:/models/clip
terms:
  - {task: eurosat, source: metaclip-l, weight: 0.5}
  - {task: mnist, source: eva-clip-l, weight: -1.0}
"""


def _recipe(tmp_path, text):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def test_good_recipe_and_defaults(tmp_path):
    recipe = load_recipe(_recipe(tmp_path, GOOD))
    assert [t.weight for t in recipe.terms] == [0.5, -1.0]
    assert recipe.solve.ridge == 1.0
    assert recipe.verify.linearity_rtol == 1e-6 and recipe.verify.equivalence_atol == 1e-5
    assert recipe.export.formats == ("onnx", "safetensors")


@pytest.mark.parametrize(
    "text,fragment",
    [
        (
            GOOD.replace("weight: 0.5", "wieght: 0.5"),
            r"recipe.yaml:3: terms\[0\]\.wieght: unknown key 'wieght' \(did you mean 'weight'\?\)",
        ),
        (
            GOOD + "solve: {ridg: 1.0}\n",
            r"recipe.yaml:5: solve\.ridg: unknown key 'ridg' \(did you mean 'ridge'\?\)",
        ),
        (
            GOOD + "exports: {out: x}\n",
            r"recipe.yaml:5: exports: unknown key 'exports' \(did you mean 'export'\?\)",
        ),
        ("target: hf:x\nterms: []\n", r"recipe.yaml:2: terms: .*at least 1"),
        ("target: hf:x\n", r"recipe.yaml:1: terms: required field is missing"),
        (GOOD.replace("0.5", ".nan"), r"terms\[0\]\.weight: .*finite"),
        (GOOD.replace("0.5", "abc"), r"terms\[0\]\.weight: .*expected a number, got 'abc'"),
        (GOOD.replace("0.5", "1.0e+9"), r"terms\[0\]\.weight: .*\|weight\| <= 100"),
        (
            GOOD.replace("0.5", "1e-3"),
            r"terms\[0\]\.weight: expected a number \(YAML reads exponents",
        ),
        (GOOD.replace("0.5", "0"), r"terms\[0\]\.weight: .*non-zero"),
        (GOOD + "solve: {ridge: -1}\n", r"solve\.ridge: .*positive"),
        (
            GOOD + "export: {formats: [onnx, tflite]}\n",
            r"export\.formats\[1\]: .*'onnx', 'safetensors' or 'triton'",
        ),
        (GOOD + "target: hf:y\n", r"recipe.yaml:5: YAML syntax error: duplicate key 'target'"),
        ("target: [unclosed\nterms: x\n", r"recipe.yaml:\d+: YAML syntax error"),
        ("- just\n- a list\n", r"expected a mapping of keys at the top level"),
        (
            GOOD.replace("task: mnist, source: eva-clip-l", "task: eurosat, source: metaclip-l"),
            r"terms\[1\]: task 'eurosat' from source 'metaclip-l' appears twice",
        ),
        (GOOD.replace("eurosat", "bad/name"), r"terms\[0\]\.task: String should match pattern"),
    ],
)
def test_bad_recipes_name_file_line_and_field(tmp_path, text, fragment):
    with pytest.raises(RecipeError, match=fragment) as info:
        load_recipe(_recipe(tmp_path, text))
    assert "\n" not in info.value.one_line()


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="file not found"):
        load_recipe(tmp_path / "nope.yaml")


def _png(path, value):
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4), (value, 0, 0)).save(path)


def _task(tmp_path, body):
    path = tmp_path / "task.yaml"
    path.write_text(body)
    return path


def test_task_grid_is_sorted_recursive_and_content_hashed(tmp_path):
    _png(tmp_path / "probes" / "b.png", 1)
    _png(tmp_path / "probes" / "a" / "z.png", 2)
    (tmp_path / "probes" / "notes.txt").write_text("not a probe")
    body = "name: t\nprobes: probes\nclasses: [cat, dog]\ntemplates: ['a {}.', 'the {}.']\n"
    spec = load_task(_task(tmp_path, body))
    assert [p.name for p in spec.probes] == ["z.png", "b.png"]  # "a/z.png" < "b.png"
    assert spec.prompts == ["a cat.", "the cat.", "a dog.", "the dog."]
    first = spec.grid_hash()
    assert grid_hash(spec.probes, ["a cat."]) != grid_hash(spec.probes, ["a cat"])
    (tmp_path / "probes" / "b.png").rename(tmp_path / "probes" / "c.png")  # renaming keeps the grid
    assert load_task(_task(tmp_path, body)).grid_hash() == first
    _png(tmp_path / "probes" / "c.png", 3)  # new bytes: new grid
    assert load_task(_task(tmp_path, body)).grid_hash() != first


@pytest.mark.parametrize(
    "body,fragment",
    [
        ("name: t\nprobes: probes\nclasses: [cat]\n", r"task.yaml:3: classes: .*at least 2"),
        ("name: t\nprobes: empty\nclasses: [cat, dog]\n", r"probes: no probe files found"),
        ("name: t\nprobes: nowhere\nclasses: [cat, dog]\n", r"probes: .* is not a folder"),
        (
            "name: t\nprobes: [missing.png]\nclasses: [cat, dog]\n",
            r"probes: file not found: .*missing.png",
        ),
        ("name: t\nprobes: probes\nclasses: [cat, cat]\n", r"classes: .*repeated: \['cat'\]"),
        (
            "name: t\nprobes: probes\nclasses: [cat, dog]\ntemplates: ['no slot']\n",
            r"templates: .*exactly one",
        ),
        (
            "name: t\nprobe: probes\nclasses: [cat, dog]\n",
            r"unknown key 'probe' \(did you mean 'probes'\?\)",
        ),
    ],
)
def test_bad_task_files(tmp_path, body, fragment):
    _png(tmp_path / "probes" / "a.png", 1)
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskError, match=fragment):
        load_task(_task(tmp_path, body))
