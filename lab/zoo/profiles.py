"""What a zoo is made of: the world's size, the members (each a tiny model built from a config
by its family's builder, then pretrained on the world), and how sources are fine-tuned.

`full` is the release zoo (committed under zoo/ at the repository root); `tiny` builds in a
minute or two and is what the tests use. Members are named by their builder (a dotted path
into targets/), so this table never needs to know a family.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ptc.lab.zoo import audio_world
from ptc.lab.zoo.world import CONTROL_TASKS, IN_DISTRIBUTION, TASKS, WorldSize


@dataclass(frozen=True)
class PretrainConfig:
    steps: int
    batch_size: int = 128
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup: int = 100
    seed: int = 0


@dataclass(frozen=True)
class Member:
    name: str          # the zoo:NAME it is loaded as
    scheme: str        # how the builder's folder is loaded: "hf" or "open_clip:local-dir"
    builder: str       # "module:function" under targets/, called as builder(folder, seed=, **options)
    options: dict = field(default_factory=dict)
    pretrain: dict = field(default_factory=dict)  # this member's changes to the profile's PretrainConfig


@dataclass(frozen=True)
class Profile:
    name: str
    world: WorldSize
    members: tuple[Member, ...]
    pretrain: PretrainConfig
    tasks: tuple[str, ...] = tuple(TASKS)
    control_tasks: tuple[str, ...] = CONTROL_TASKS
    template_share: float = 0.5
    finetune_steps: int = 250
    finetune_rank: int = 4
    finetune_dropout: float = 0.0  # peft's lora_dropout for the sources
    seeds: tuple[int, ...] = (0, 1, 2)  # fine-tuning seeds: one source per (member, task, seed)
    # Plain-style variants of some tasks (world.IN_DISTRIBUTION), with sources for the first
    # seed only; kept apart from `tasks` so the paper's tables stay on the shifted tasks.
    in_distribution_tasks: tuple[str, ...] = ()
    seed: int = 0                         # the world's and the initial weights' seed
    world_kind: str = "image"             # which generated world (worlds.KINDS) the members learn
    folder: str = ""                      # where under the zoo root the profile builds by default
    scratch: bool = False                 # built afresh under `ptc paper --out` (a test-size profile)

    @property
    def source_tasks(self) -> tuple[str, ...]:
        """Tasks that get fine-tuned sources: all but the controls."""
        return tuple(t for t in self.tasks if t not in self.control_tasks)

    def member(self, name: str) -> Member:
        for member in self.members:
            if member.name == name:
                return member
        raise KeyError(name)


FULL = Profile(
    name="full",
    # One shift shared by every task's splits. A shift per task (downstream_shift="per-task")
    # reproduced the paper's agreement (same task 0.47, different 0.25) but took train retention
    # 0.616 -> 0.561, under its criterion, so it was not kept (results/trials/README.md).
    # test_extra: 240 more held-out images per class, regenerated (not committed), so that the
    # report's 95% interval on retention is within +-0.03; on the committed 60 alone it was +-0.06.
    world=WorldSize(pretrain=12000, probes=400, train=40, test=60, test_extra=240),
    members=(
        # Pretraining length is the lever found so far: at 2,500 steps clip's quadrant, shape and
        # size prompts collapsed (0.93-0.99), at 4,000 shape and size still did (0.91, 0.92) and
        # cross-model retention was 0.05; with clip at 6,000 and siglip and resnet at 5,000 no
        # prompt collapsed and it was 0.35. Then vit (the last member at 2,500) went to 6,000 and
        # resnet (the weakest source, the narrowest tower) to width 20, both chosen before
        # scoring and kept whatever the score: 0.46. siglip at 8,000 steps was tried next and NOT
        # kept (a choice made after scoring, said so in the README): retention 0.42, same-task
        # agreement fell below different-task, and the README demo turned destructive. (Those
        # figures are at ridge 0.001; `ptc paper` then chose 1e-4 on train: 0.44, and 0.45 with the
        # 300-step sources below; it now holds Random-UTD to its bar on train too.) The next
        # lever is what the embeddings encode linearly (`ptc paper`'s headroom table), and
        # benchmarks/style_pilot.py measures one fair way to raise it. A whole zoo pretrained that
        # way (pretrain_style="spread") was built and judged on train: retention 0.24 against 0.41
        # for a plain zoo built alike, so the world stays plain (results/trials/README.md).
        Member("clip", "hf", "hf_clip:build_tiny", {"width": 64, "embed_dim": 64, "layers": 4, "heads": 4, "patch_size": 4},
               pretrain={"steps": 6000}),
        Member("siglip", "hf", "hf_siglip:build_tiny", {"width": 80, "layers": 4, "heads": 4, "patch_size": 4},
               pretrain={"steps": 5000}),
        Member("vit", "open_clip:local-dir", "openclip:build_tiny",
               {"width": 64, "embed_dim": 48, "layers": 4, "heads": 4, "patch_size": 4}, pretrain={"steps": 6000}),
        # The fourth family was an open_clip ModifiedResNet (width 20, embedding 56, 5,000 steps),
        # the weakest source on every split. An EVA02 timm tower (the paper's EVA-CLIP family)
        # replaced it, judged on train by a criterion written first (benchmarks/member_trial.py):
        # retention 0.49 -> 0.60, cross-model gain +6.0 -> +8.3 (results/trials/README.md).
        Member("eva", "open_clip:local-dir", "openclip:build_tiny_eva", {"embed_dim": 72}, pretrain={"steps": 6000}),
    ),
    pretrain=PretrainConfig(steps=2500, batch_size=128, lr=1e-3),
    template_share=0.3,
    # 300 steps, chosen on the train split (benchmarks/source_trial.py, criterion written down
    # first: cross-model gain >= +5.1 and retention > 0.47): 150 -> 300 took train retention
    # 0.44 -> 0.49 and cross-model gain +5.1 -> +6.0; 50 took them to 0.31 and +3.0.
    finetune_steps=300,
    in_distribution_tasks=tuple(IN_DISTRIBUTION),
)

TINY = Profile(
    name="tiny",
    world=WorldSize(pretrain=1000, probes=48, train=10, test=16, test_extra=4),
    members=(
        Member("clip", "hf", "hf_clip:build_tiny", {"width": 32, "embed_dim": 24, "layers": 2, "heads": 2, "patch_size": 8}),
        Member("vit", "open_clip:local-dir", "openclip:build_tiny",
               {"width": 32, "embed_dim": 20, "layers": 2, "heads": 2, "patch_size": 8}),
    ),
    pretrain=PretrainConfig(steps=150, batch_size=64, lr=3e-3, warmup=20),
    tasks=("colour", "count", "background"),
    template_share=0.8,
    finetune_steps=25,
    seeds=(0, 1),
    scratch=True,
)

# CLAP members: HTSAT audio towers of different width and depth (as the paper's four CLAP
# checkpoints differ), RoBERTa text towers, each pretrained on the audio world.
AUDIO = Profile(
    name="audio",
    world=WorldSize(pretrain=6000, probes=200, train=30, test=40),
    members=(
        Member("clap-s", "hf", "hf_clap:build_tiny", {"embed_dim": 24, "patch_width": 16, "depths": (1, 1),
                                                       "text_width": 32}),
        Member("clap-m", "hf", "hf_clap:build_tiny", {"embed_dim": 32, "patch_width": 24, "depths": (2, 2),
                                                       "text_width": 48}),
        Member("clap-d", "hf", "hf_clap:build_tiny", {"embed_dim": 40, "patch_width": 16, "depths": (1, 1, 1),
                                                       "text_width": 32}),
    ),
    # At 1,500 steps the loss was still falling (zoo:clap-s: 2.7 then, 2.1 at 6,000, its
    # `pretrain.final_loss` in zoo/audio/zoo.json). Tempo's prompts collapse at either length.
    pretrain=PretrainConfig(steps=6000, batch_size=64, lr=1e-3),
    tasks=tuple(audio_world.TASKS), control_tasks=audio_world.CONTROL_TASKS,
    template_share=0.3,
    finetune_steps=100,
    world_kind="audio",
    folder="audio",
)

AUDIO_TINY = Profile(
    name="audio-tiny",
    world=WorldSize(pretrain=128, probes=16, train=4, test=6),
    members=(
        Member("clap-a", "hf", "hf_clap:build_tiny", {"embed_dim": 16, "patch_width": 8, "depths": (1, 1),
                                                       "text_width": 16, "text_layers": 1}),
        Member("clap-b", "hf", "hf_clap:build_tiny", {"embed_dim": 20, "patch_width": 8, "depths": (1, 1, 1),
                                                       "text_width": 16, "text_layers": 1}),
    ),
    pretrain=PretrainConfig(steps=20, batch_size=32, lr=3e-3, warmup=5),
    tasks=("pitch", "tempo", "noise"), control_tasks=audio_world.CONTROL_TASKS,
    template_share=0.8,
    finetune_steps=6,
    seeds=(0,),
    world_kind="audio",
    folder="audio-tiny",
    scratch=True,
)

PROFILES = {profile.name: profile for profile in (FULL, TINY, AUDIO, AUDIO_TINY)}
