"""Can a zoo CLAP member's audio tower read an audio-world attribute at all? Trains the tower
(with a linear head) supervised on clean clips of one task and scores held-out clips in both
styles: clean (as pretraining hears them) and shifted (as the downstream splits are). A task
the tower cannot read even with labels cannot be learned from captions either.

    python3 -m ptc.lab.benchmarks.audio_tasks --task tempo --steps 300
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

import torch

from ptc import targets
from ptc.lab.zoo import audio_world
from ptc.lab.zoo.build import _builder
from ptc.lab.zoo.profiles import AUDIO


def _clips(encoder, task: str, count: int, shifted: bool, rng: random.Random, folder: Path):
    """(input batch, labels) of `count` random clips, written and read as the zoo reads them."""
    classes = list(audio_world.TASKS[task][0])
    clips = [audio_world.sample_clip(rng) for _ in range(count)]
    paths = []
    for i, clip in enumerate(clips):
        paths.append(folder / f"{'shifted' if shifted else 'clean'}-{i}.wav")
        audio_world._save(clip, paths[-1], shifted, rng)
    return encoder.load_inputs(paths), torch.tensor([classes.index(c.value(task)) for c in clips])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="tempo", choices=sorted(audio_world.TASKS))
    parser.add_argument(
        "--member", default=AUDIO.members[0].name, choices=[m.name for m in AUDIO.members]
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    torch.manual_seed(0)
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        member = AUDIO.member(args.member)
        encoder = targets.load(
            f"{member.scheme}:{_builder(member)(scratch / 'model', seed=0, **member.options)}"
        )
        tests = {
            style: _clips(encoder, args.task, 256, style == "shifted", rng, scratch)
            for style in ("clean", "shifted")
        }
        module = encoder.trainable().train()
        head = torch.nn.Linear(encoder.embed_dim, len(audio_world.TASKS[args.task][0]))
        optimizer = torch.optim.AdamW(
            [p for p in module.parameters() if p.requires_grad] + list(head.parameters()),
            lr=args.lr,
        )
        start = time.perf_counter()
        for step in range(1, args.steps + 1):
            inputs, labels = _clips(encoder, args.task, 64, False, rng, scratch)
            loss = torch.nn.functional.cross_entropy(
                head(encoder.embed_with(module, inputs)), labels
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % 100 == 0 or step == args.steps:
                module.eval()
                with torch.no_grad():
                    scores = {
                        style: float(
                            (head(encoder.embed_with(module, x)).argmax(1) == y).float().mean()
                        )
                        for style, (x, y) in tests.items()
                    }
                module.train()
                print(
                    f"{args.member} {args.task} step {step}: loss {loss.item():.3f}, held-out accuracy clean "
                    f"{scores['clean']:.3f}, shifted {scores['shifted']:.3f} ({time.perf_counter() - start:.0f}s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
