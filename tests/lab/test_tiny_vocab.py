"""Every zoo member's text tower reads a whole caption of its world: a tokenizer that spells
words out letter by letter ran past the context and cut the last attributes off (SigLIP's cut
every digit prompt to the same string), which left those tasks collapsed for the zoo."""

import json
import os
import subprocess
import sys

import pytest

from ptc import targets
from ptc.lab.tiny_vocab import PROMPT_WORDS, byte_bpe
from ptc.lab.zoo.build import _builder
from ptc.lab.zoo.profiles import AUDIO, FULL, Member, WorldSize
from ptc.lab.zoo.worlds import world_module

CAPTIONS = WorldSize(pretrain=300, probes=1, train=0, test=0)
CASES = [(profile, member) for profile in (FULL, AUDIO) for member in profile.members]


@pytest.fixture(scope="module")
def longest_captions(tmp_path_factory):
    """profile name -> its world's longest pretraining caption (of 300 drawn)."""
    longest = {}
    for profile in (FULL, AUDIO):
        root = tmp_path_factory.mktemp(profile.name)
        world_module(profile.world_kind).write_world(
            root, CAPTIONS, seed=profile.seed, template_share=0.0
        )
        captions = [
            json.loads(line)["caption"]
            for line in (root / "pretrain" / "captions.jsonl").read_text().splitlines()
        ]
        longest[profile.name] = max(captions, key=len)
    return longest


def _built(member, folder):
    # the zoo build's own resolution of a builder
    _builder(member)(folder, seed=0, **member.options)
    return targets.load(f"{member.scheme}:{folder}")


@pytest.mark.parametrize(("profile", "member"), CASES, ids=[f"{p.name}-{m.name}" for p, m in CASES])
def test_the_last_word_of_the_longest_caption_reaches_the_text_embedding(
    profile, member, longest_captions, tmp_path
):
    caption = longest_captions[profile.name]
    assert len(caption.split()) >= 15 and caption.endswith(".")  # several attributes named
    # Only the very end differs ("... background." against "... backgrounds."): a cut caption
    # embeds the same either way.
    encoder = _built(member, tmp_path / member.name)
    original, changed = encoder.embed_prompts([caption, caption[:-1] + "s."])
    assert (original - changed).abs().max().item() > 1e-5, (
        f"{member.name} never sees the end of {caption!r}"
    )


@pytest.mark.parametrize(
    "builder", ["hf_clip:build_tiny", "hf_clap:build_tiny", "hf_siglip:build_tiny"]
)
def test_every_prompt_word_is_one_token(builder, tmp_path):
    _builder(Member("m", "hf", builder))(tmp_path, seed=0)
    tokenizer = targets.load(f"hf:{tmp_path}").tokenizer
    bare = len(tokenizer("a")["input_ids"])  # "a" is one token, plus the tokenizer's specials
    lengths = {word: len(tokenizer(f"a {word}")["input_ids"]) - bare for word in PROMPT_WORDS}
    assert {word: n for word, n in lengths.items() if n != 1} == {}
    # Any other string still tokenises (byte fallback), just not as one token.
    assert len(tokenizer("a zyxwvut")["input_ids"]) - bare > 1


def _library_bpe(space_prefix):
    """The `tokenizers` library's own BPE trainer on the same words (an independent computation)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=100_000,
        min_frequency=1,
        show_progress=False,
        special_tokens=[],
        initial_alphabet=list(bytes_to_unicode().values()),
    )
    tokenizer.train_from_iterator(
        [w for word in PROMPT_WORDS for w in (word, space_prefix + word)], trainer
    )
    model = json.loads(tokenizer.to_str())["model"]
    return (
        [t for _, t in sorted((i, t) for t, i in model["vocab"].items())],
        [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]],
    )


def test_the_bpe_trainer_matches_the_tokenizers_library_where_that_one_is_stable():
    # Space-prefixed words (RoBERTa's, CLAP's) use only the byte alphabet, which the library
    # numbers in a fixed order; there its merges and ours must be the same, in the same order.
    tokens, merges = byte_bpe(space_prefix="\u0120")
    library_tokens, library_merges = _library_bpe(" ")
    assert list(merges) == library_merges and list(tokens) == library_tokens


def test_the_bpe_trainer_gives_the_same_merges_in_every_process():
    # The library numbered CLIP's end-of-word symbols in hash-map order, which differs per process.
    script = (
        "import hashlib; from ptc.lab.tiny_vocab import byte_bpe; "
        "print(hashlib.sha256(repr(byte_bpe(word_suffix='</w>')).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(digests) == 1 and len(digests.pop()) == 65
