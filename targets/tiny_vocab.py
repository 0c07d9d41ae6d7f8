"""Word-level vocabularies for the tiny models the tests and the zoo build from configs.

A real CLIP, CLAP or SigLIP tokenizer holds every common English word as one token, so a
caption of twenty words is about twenty tokens. A tokenizer of bare bytes (no merges) spells
every word out letter by letter: captions then run past the text tower's context and are cut,
and whatever they named last is lost. SigLIP's 16-token context cut "a handwritten digit
three" to "a handwritten di", so every digit prompt was the same string. So the tiny
tokenizers get merges trained here, offline, on a list of prompt English: each listed word
becomes one token, and any other string still tokenises byte by byte.
"""

from __future__ import annotations

import json
from functools import lru_cache

# Prompt English: what captions and zero-shot prompts of natural and generated worlds say
# (the zoo's image and audio worlds included), one entry per word form.
PROMPT_WORDS = tuple(dict.fromkeys("""
a an the of in on at to with and or is are it its this that behind over same something thing
object photo picture image sound audio clip recording small large big little dark light bright
red green blue yellow orange purple white black grey pink brown colour color coloured
shape shapes square squares circle circles triangle triangles cross crosses ring rings
diamond diamonds star stripe dot line dog cat bird car plane ship truck horse deer frog
handwritten digit number count one two three four corner top bottom left right
background pattern plain striped dotted checkered gradient
tone note pitched pitch wave sine sawtooth pulse pulsing beeps tempo slow medium fast
rising falling steady noise middle high very low
""".split()))


@lru_cache(maxsize=None)
def byte_bpe(word_suffix: str = "", space_prefix: str = "") -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(tokens beyond the byte alphabet, merges) of a byte-level BPE trained on PROMPT_WORDS.

    CLIP marks a word's end (`word_suffix="</w>"`); GPT-2 / RoBERTa mark a preceding space
    (`space_prefix="Ġ"`), so each word is learned both with and without its space. The
    trainer is the `tokenizers` library's own (it comes with transformers)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    words = [w for word in PROMPT_WORDS for w in ((word, " " + word) if space_prefix else (word,))]
    suffix = {"end_of_word_suffix": word_suffix} if word_suffix else {}
    tokenizer = Tokenizer(models.BPE(**suffix))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(vocab_size=100_000, min_frequency=1, show_progress=False, special_tokens=[],
                                  initial_alphabet=list(bytes_to_unicode().values()), **suffix)
    tokenizer.train_from_iterator(words, trainer)
    model = json.loads(tokenizer.to_str())["model"]
    merges = tuple(tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"])
    return tuple(token for _, token in sorted((i, t) for t, i in model["vocab"].items())), merges


def extend_vocab(vocab: dict[str, int], tokens: tuple[str, ...]) -> dict[str, int]:
    """`vocab` with every token it lacks appended, ids in order."""
    for token in tokens:
        vocab.setdefault(token, len(vocab))
    return vocab
