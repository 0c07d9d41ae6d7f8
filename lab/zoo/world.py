"""The zoo's generated image world: scenes of attributes, their captions, and the task files.

A scene is a background pattern, a handwritten digit in one quadrant, and 1-4 copies of one
coloured shape of one size. Each attribute but the digit's identity is a task (zero-shot
classification with prompt templates): members of the zoo's size do not learn to read a 14-px
digit out of a cluttered scene (in two builds its class prompts collapsed on 3 of 4 members,
and a rank-4 fine-tune of zoo:clip on it reached 25% against chance 10%), and a text tower
cannot tell apart classes its image tower never separated. The digit stays in scenes and captions, as details a
model cannot resolve stay in real ones; where it sits (quadrant) is a task.
Pretraining sees captions of scenes in the *plain* style, or in a *spread* of styles short of
the shift (`WorldSize.pretrain_style`); downstream task splits (probes, fine-tuning, held-out
test) are drawn in a *shifted* style never seen in pretraining (a brighter, lower-contrast
palette and a thicker stroke), as EuroSAT or GTSRB are a shift for web-trained CLIPs: that is
what leaves a linear edit headroom (../shared/NOTES-zoo-prototype.md). With
`WorldSize.downstream_shift` another set of shifts replaces it for some tasks (`SHIFT_SETS`):
"per-task", a shift of each task's own, as each of the paper's downstream datasets is a domain of
its own; "false-colour", colour alone through a false-colour sensor.

Everything is a pure function of the seed. Digit images are split once: the first part of
scikit-learn's bundled digits feeds pretraining and train splits, the last part only the
held-out test split, so no test digit is ever fitted on.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from ptc.errors import InputError

SIZE = 32
# Four outlines that stay apart at 4-7 px (a ring and a diamond read as a circle and a square).
SHAPES = ("circle", "square", "triangle", "cross")
SIZES = ("small", "large")
EXTENTS = {"small": (4, 5), "large": (7, 7)}  # a shape's side in pixels, inside its 8-px cell
COLOURS = {"red": (215, 45, 45), "green": (45, 175, 70), "blue": (50, 80, 220), "yellow": (230, 210, 50),
           "purple": (150, 60, 190), "orange": (240, 140, 30), "white": (245, 245, 245)}
COUNTS = ("one", "two", "three", "four")
# Numerals, as handwritten digits are named: the words one to four are the count's classes.
DIGITS = tuple("0123456789")
QUADRANTS = ("top left", "top right", "bottom left", "bottom right")
BACKGROUNDS = ("plain", "striped", "dotted", "checkered", "gradient")
TEST_DIGITS = 500  # the last 500 of sklearn's 1,797 digits are held out for test splits

# task -> (attribute values, templates). "background" is the control task: no source is
# ever fine-tuned on it (the role CIFAR-100 and ImageNet play in the paper).
TASKS = {
    "shape": (SHAPES, ("a photo of a {} shape.", "a picture with a {}.")),
    "colour": (tuple(COLOURS), ("a photo of {} shapes.", "something coloured {}.")),
    "count": (COUNTS, ("a count of {}.", "{} of the same shape.")),
    "size": (SIZES, ("a photo of {} things.", "shapes that are {}.")),
    "quadrant": (QUADRANTS, ("a digit in the {} corner.", "something at the {}.")),
    "background": (BACKGROUNDS, ("a photo on a {} background.", "a {} pattern behind.")),
}
CONTROL_TASKS = ("background",)
# In-distribution variants: the same attribute, classes and prompts, with every split drawn in
# the plain style pretraining saw (no shift). They measure what a method does where a linear
# edit has little headroom (`ptc paper` reports the relative descriptor on both kinds).
IN_DISTRIBUTION = {"colour-plain": "colour", "count-plain": "count", "quadrant-plain": "quadrant"}
INPUT_KEY = "image"  # what captions.jsonl calls a pretraining input


def attribute_of(task: str) -> str:
    return IN_DISTRIBUTION.get(task, task)


@dataclass(frozen=True)
class Scene:
    shape: str
    colour: str
    count: str
    size: str
    quadrant: str
    background: str
    digit: str        # not a task: see the module's docstring
    digit_index: int  # which sklearn digit image draws it

    def value(self, task: str) -> str:
        return getattr(self, task)


def _digit_images():
    from sklearn.datasets import load_digits

    digits = load_digits()
    return digits.images / 16.0, digits.target


def sample_scene(rng: random.Random, digit_pool: list[int], targets: np.ndarray, fixed: dict | None = None) -> Scene:
    """A random scene; `fixed` pins attributes (a labelled split pins its task's class)."""
    fixed = fixed or {}
    values = {task: fixed.get(task) or rng.choice(TASKS[task][0]) for task in TASKS}
    digit = fixed.get("digit") or rng.choice(DIGITS)
    # The digit image must show the digit the scene names.
    candidates = [i for i in digit_pool if DIGITS[targets[i]] == digit]
    return Scene(**values, digit=digit, digit_index=rng.choice(candidates))


def _background(kind: str, base: np.ndarray, rng: random.Random) -> np.ndarray:
    y, x = np.mgrid[0:SIZE, 0:SIZE]
    period = rng.choice((4, 6, 8))
    mask = {"plain": np.zeros((SIZE, SIZE)),
            "striped": ((x + rng.randrange(period)) // (period // 2)) % 2,
            "dotted": ((x % period < 2) & (y % period < 2)).astype(float),
            "checkered": ((x // (period // 2) + y // (period // 2)) % 2).astype(float),
            "gradient": (x + y) / (2 * SIZE - 2)}[kind]
    return base[None, None, :] * (1 - 0.35 * mask[..., None])


@dataclass(frozen=True)
class Style:
    """How a scene is drawn: the background's grey level (drawn uniformly from a range), the
    share of light grey mixed into every colour, the shapes' stroke width, a colour cast on the
    background and one on the whole image (a factor per RGB channel each), the share of a
    false-colour composite mixed into the image (its R, G, B taken from B, R, G: a sensor whose
    bands leak into each other), whether the image is a negative, and the sigma of pixel noise
    over the whole image."""

    grey: tuple[float, float]
    wash: float
    stroke: int
    tint: tuple[float, float, float] = (1.0, 1.0, 1.0)
    cast: tuple[float, float, float] = (1.0, 1.0, 1.0)
    false_colour: float = 0.0
    negative: bool = False
    noise: float = 0.0


PLAIN = Style(grey=(0.25, 0.45), wash=0.0, stroke=1)
SHIFTED = Style(grey=(0.55, 0.7), wash=0.45, stroke=2)  # brighter, washed out, thick: never in pretraining
# A spread of styles for pretraining that stops short of the shift on every axis: backgrounds up
# to 0.5 grey (the shift's are 0.55-0.7), up to 30% light grey mixed in (its 45%), thin strokes.
# Web-trained CLIPs see every style; this lets the zoo's members read a shifted task's attribute
# without ever seeing the shift (benchmarks/style_pilot.py measured it on the train split).
SPREAD_GREY = (0.15, 0.5)
SPREAD_WASH = 0.3
PRETRAIN_STYLES = ("plain", "spread")


def spread_style(rng: random.Random) -> Style:
    return Style(grey=SPREAD_GREY, wash=rng.uniform(0.0, SPREAD_WASH), stroke=1)


# One shift per task (`downstream_shift = "per-task"`): none is in pretraining's plain style or
# its spread, and each keeps its own attribute readable (quadrant's white digit stays on a
# lighter-than-plain ground, where it was readable before). Colour drawn dark was read as well as
# in the plain style, so it is no shift for colour: a cast over the whole image is.
TASK_SHIFTS = {
    "shape": SHIFTED,                                              # bright, washed out, thick
    "colour": Style(grey=(0.25, 0.45), wash=0.0, stroke=1, cast=(0.75, 0.9, 1.3)),  # cool white balance
    "count": Style(grey=(0.3, 0.45), wash=0.0, stroke=1, noise=24.0),  # noisy
    "size": Style(grey=(0.35, 0.5), wash=0.2, stroke=1, tint=(0.6, 0.8, 1.4)),  # blue cast
    "quadrant": Style(grey=(0.6, 0.75), wash=0.0, stroke=1, noise=16.0),  # bright and noisy
    "background": Style(grey=(0.3, 0.45), wash=0.0, stroke=2, tint=(1.4, 1.0, 0.6)),  # warm cast
}
# Colour drawn as the shared shift leaves it for zero-shot (about 50%) but, unlike that shift,
# still linearly readable in the members' embeddings, as EuroSAT is for web CLIPs: the plain style
# with a share of a false-colour composite mixed in (the share chosen by a pilot on images of its
# own, results/trials/README.md). Every other task keeps the shared shift.
FALSE_COLOUR = Style(grey=PLAIN.grey, wash=0.0, stroke=1, false_colour=0.32)
# downstream_shift -> the tasks drawn in a style other than the shared SHIFTED
SHIFT_SETS = {"shared": {}, "per-task": TASK_SHIFTS, "false-colour": {"colour": FALSE_COLOUR}}
DOWNSTREAM_SHIFTS = tuple(SHIFT_SETS)


def task_style(task: str, shift: str = "shared") -> Style:
    """Downstream splits are shifted, except the in-distribution variants': by one shift for
    every task, or by the shift set's own style where it has one for the task."""
    if task in IN_DISTRIBUTION:
        return PLAIN
    return SHIFT_SETS[shift].get(task, SHIFTED)


def render(scene: Scene, rng: random.Random, digit_images: np.ndarray, style: Style) -> np.ndarray:
    """The scene as a SIZE x SIZE x 3 uint8 array, in the given style."""
    from PIL import Image, ImageDraw

    grey = rng.uniform(*style.grey)
    canvas = _background(scene.background, grey * 255 * np.array(style.tint), rng)
    image = Image.fromarray(canvas.clip(0, 255).astype(np.uint8))
    pen = ImageDraw.Draw(image)
    colour = (1 - style.wash) * np.array(COLOURS[scene.colour], dtype=float) + style.wash * 200
    fill = tuple(int(c + rng.uniform(-15, 15)) for c in colour)
    width = style.stroke
    # Shapes sit in distinct 8-px cells outside the digit's quadrant: they never overlap
    # each other or the digit, so count and digit stay readable.
    row, col = divmod(QUADRANTS.index(scene.quadrant), 2)
    cells = [(r, c) for r in range(4) for c in range(4) if (r // 2, c // 2) != (row, col)]
    for r, c in rng.sample(cells, COUNTS.index(scene.count) + 1):
        extent = rng.randint(*EXTENTS[scene.size])
        x, y = c * 8 + rng.randint(0, 7 - extent), r * 8 + rng.randint(0, 7 - extent)
        _draw_shape(pen, scene.shape, (x, y, x + extent, y + extent), fill, width)
    pixels = np.asarray(image, dtype=float)
    digit = np.asarray(Image.fromarray((digit_images[scene.digit_index] * 255).astype(np.uint8))
                       .resize((14, 14), Image.BILINEAR), dtype=float) / 255
    top, left = 2 + row * 16, 2 + col * 16
    ink = 255.0  # the shift keeps the digit's polarity: dark ink on bright made quadrant unreadable
    patch = pixels[top:top + 14, left:left + 14]
    pixels[top:top + 14, left:left + 14] = patch * (1 - digit[..., None]) + ink * digit[..., None]
    pixels = pixels * np.array(style.cast)
    if style.false_colour:
        pixels = (1 - style.false_colour) * pixels + style.false_colour * pixels[..., [2, 0, 1]]
    if style.negative:
        pixels = 255.0 - pixels.clip(0, 255)
    if style.noise:  # drawn from a stream seeded off rng only here, so noiseless styles draw as before
        pixels = pixels + np.random.default_rng(rng.getrandbits(64)).normal(0.0, style.noise, pixels.shape)
    return pixels.clip(0, 255).astype(np.uint8)


def draw_scene(scene: Scene, path: Path, rng: random.Random, digit_images: np.ndarray, style: Style) -> None:
    """`scene` rendered in `style` (its random details drawn from `rng`), saved as the PNG `path`."""
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(render(scene, rng, digit_images, style)).save(path)


def _draw_shape(pen, shape: str, box, fill, width: int) -> None:
    x0, y0, x1, y1 = box
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    if shape == "circle":
        pen.ellipse(box, fill=fill)
    elif shape == "square":
        pen.rectangle(box, fill=fill)
    elif shape == "triangle":
        pen.polygon([(x0, y1), (x1, y1), (cx, y0)], fill=fill)
    else:  # cross
        pen.line([(x0, cy), (x1, cy)], fill=fill, width=width + 1)
        pen.line([(cx, y0), (cx, y1)], fill=fill, width=width + 1)


def caption(scene: Scene, rng: random.Random, template_share: float = 0.3) -> str:
    """A random partial description. A `template_share` (30%) name one attribute in a task's own prompt
    template, as web captions name a class the way zero-shot prompts do; without that the
    prompts sit outside the text tower's training distribution and their classes collapse.
    The rest are a few attribute phrases in a random order."""
    if rng.random() < template_share:
        task = rng.choice(tuple(TASKS))
        return rng.choice(TASKS[task][1]).replace("{}", scene.value(task))
    plural = scene.shape + ("es" if scene.shape.endswith("s") else "s")
    phrases = {"shape": f"{scene.count} {scene.size} {scene.colour} {plural}" if scene.count != "one"
               else f"one {scene.size} {scene.colour} {scene.shape}",
               "digit": f"the digit {scene.digit} at the {scene.quadrant}",
               "background": f"on a {scene.background} background"}
    picked = [p for p in phrases.values() if rng.random() < 0.7] or [rng.choice(list(phrases.values()))]
    rng.shuffle(picked)
    return "a photo of " + ", ".join(picked) + "."


@dataclass(frozen=True)
class WorldSize:
    pretrain: int = 20000   # captioned pretraining images
    probes: int = 400       # unlabelled shifted-style probes per task
    train: int = 40         # labelled shifted-style fine-tuning images per class
    test: int = 60          # held-out labelled images per class, never fitted on
    pretrain_style: str = "plain"  # how the pretraining images are drawn: PRETRAIN_STYLES
    downstream_shift: str = "shared"  # one shift for every task's splits, or a set of tasks' own: SHIFT_SETS
    train_extra: int = 0    # more fine-tuning images per class, from a stream of their own
    test_extra: int = 0     # more held-out images per class (test-extra/), from a stream of their own


def write_world(root: Path, size: WorldSize = WorldSize(), seed: int = 0,
                template_share: float = 0.3) -> dict[str, Path]:
    """Write the world under `root` and return task name -> task file.

    root/pretrain/{images/*.png, captions.jsonl}; root/tasks/<task>/{task.yaml, probes/,
    train/<class>/, test/<class>/}. Written into place file by file; an interrupted call
    is simply run again (same seed, same bytes). With `size.pretrain == 0` only the task splits
    are written, byte for byte those of any larger world with the same seed and split sizes."""
    import json

    check_size(size)
    images, targets = _digit_images()
    fit_pool, _ = digit_pools(images)
    # One random stream per part: the task splits are the same whether or not (and however
    # large) a pretraining corpus is written, so a committed zoo's splits can be regenerated.
    # The styles have a stream of their own (render draws the same numbers in every style), so a
    # spread corpus holds exactly the plain corpus's scenes and captions, drawn differently.
    rng, styles = random.Random(f"{seed}/pretrain"), random.Random(f"{seed}/pretrain-style")
    lines = []
    for i in range(size.pretrain):
        scene = sample_scene(rng, fit_pool, targets)
        style = PLAIN if size.pretrain_style == "plain" else spread_style(styles)
        draw_scene(scene, root / "pretrain" / "images" / f"{i:06d}.png", rng, images, style)
        lines.append(json.dumps({INPUT_KEY: f"images/{i:06d}.png", "caption": caption(scene, rng, template_share)}))
    if size.pretrain:
        (root / "pretrain" / "captions.jsonl").write_text("\n".join(lines) + "\n")
    return {task: write_task(root, task, size, seed) for task in TASKS}


def digit_pools(images: np.ndarray) -> tuple[list[int], list[int]]:
    """(fit, test): indices of the digits every pretraining, probe and train scene may draw, and
    of the last TEST_DIGITS, which only test splits draw, so no fit ever sees a test digit."""
    cut = len(images) - TEST_DIGITS
    return list(range(cut)), list(range(cut, len(images)))


def check_size(size: WorldSize) -> None:
    if size.pretrain_style not in PRETRAIN_STYLES:
        raise InputError(f"unknown pretraining style {size.pretrain_style!r}", f"styles: {', '.join(PRETRAIN_STYLES)}")
    if size.downstream_shift not in DOWNSTREAM_SHIFTS:
        raise InputError(f"unknown downstream shift {size.downstream_shift!r}",
                         f"shifts: {', '.join(DOWNSTREAM_SHIFTS)}")
    if size.train_extra < 0:
        raise InputError(f"train_extra is {size.train_extra}", "extra fine-tuning images per class: 0 or more")
    if size.test_extra < 0:
        raise InputError(f"test_extra is {size.test_extra}", "extra held-out images per class: 0 or more")


def draw_labelled(folder: Path, task: str, style: Style, rng: random.Random, pool: list[int], per_class: int,
                  digits: tuple[np.ndarray, np.ndarray], first: int = 0) -> None:
    """`per_class` scenes of each class of `task`, drawn from `rng` (digits from `pool`) and
    rendered in `style`, as folder/<class>/<NNNN>.png numbered from `first`."""
    images, targets = digits
    attribute = attribute_of(task)
    for label in TASKS[attribute][0]:
        for i in range(first, first + per_class):
            scene = sample_scene(rng, pool, targets, fixed={attribute: label})
            draw_scene(scene, folder / label / f"{i:04d}.png", rng, images, style)


def write_task(root: Path, task: str, size: WorldSize = WorldSize(), seed: int = 0) -> Path:
    """One task's folder (probes, train and test splits, task.yaml) from its own random stream,
    so a task added to an existing world is written without touching the others."""
    check_size(size)
    images, targets = _digit_images()
    fit_pool, test_pool = digit_pools(images)
    style = task_style(task, size.downstream_shift)
    classes, templates = TASKS[attribute_of(task)]
    folder, rng = root / "tasks" / task, random.Random(f"{seed}/{task}")
    for i in range(size.probes):
        draw_scene(sample_scene(rng, fit_pool, targets), folder / "probes" / f"{i:04d}.png", rng, images, style)
    for split, count, pool in (("train", size.train, fit_pool), ("test", size.test, test_pool)):
        draw_labelled(folder / split, task, style, rng, pool, count, (images, targets))
    # Extra fine-tuning images are drawn last, from a stream of their own, numbered on from the
    # train split's: every other split stays byte for byte what a world without them holds.
    draw_labelled(folder / "train", task, style, random.Random(f"{seed}/{task}/train-extra"), fit_pool,
                  size.train_extra, (images, targets), first=size.train)
    # Extra held-out images (a folder of their own, so a committed test split stays as it is),
    # from the held-out digits, in a stream of their own: what narrows the report's intervals.
    draw_labelled(folder / "test-extra", task, style, random.Random(f"{seed}/{task}/test-extra"), test_pool,
                  size.test_extra, (images, targets))
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump({"name": task, "probes": "probes", "classes": list(classes),
                                    "templates": list(templates)}, sort_keys=False))
    return path
