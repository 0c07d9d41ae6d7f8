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

from functools import cache

# Prompt English: what captions and zero-shot prompts of natural and generated worlds say
# (the zoo's image and audio worlds included), one entry per word form.
PROMPT_WORDS = tuple(
    dict.fromkeys(
        """
a an the of in on at to with and or is are it its this that behind over same something thing
object photo picture image sound audio clip recording small large big little dark light bright
red green blue yellow orange purple white black grey pink brown colour color coloured
shape shapes square squares circle circles triangle triangles cross crosses ring rings
diamond diamonds star stripe dot line dog cat bird car plane ship truck horse deer frog
handwritten digit number count one two three four corner top bottom left right
background pattern plain striped dotted checkered gradient
tone note notes pitched pitch wave sine sawtooth pulse pulsing beeps tempo slow medium fast
rising falling steady short long noise middle high very low
""".split()
    )
)


@cache
def byte_bpe(
    word_suffix: str = "", space_prefix: str = ""
) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(tokens, merges) of a byte-level BPE trained on PROMPT_WORDS until every word is one token.

    CLIP marks a word's end (`word_suffix="</w>"`); GPT-2 / RoBERTa mark a preceding space
    (`space_prefix="Ġ"`), so each word is learned both with and without its space. Tokens are
    the initial symbols, then each merge's result, in the order made. Written out rather than
    taken from the `tokenizers` trainer: that one numbers end-of-word symbols in hash-map order,
    so its merges (and every model built on them) changed from one process to the next. Ties
    are broken as that trainer does when its numbering is stable: the pair of lowest ids."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_symbol = bytes_to_unicode()
    words = []
    for word in PROMPT_WORDS:
        encoded = "".join(byte_symbol[b] for b in word.encode())
        words.append(list(encoded[:-1]) + [encoded[-1] + word_suffix])
        if space_prefix:
            words.append([space_prefix, *encoded[:-1], encoded[-1] + word_suffix])
    # Token ids: the initial symbols in code-point order, then each merge's result as made.
    ids = {
        symbol: i
        for i, symbol in enumerate(
            sorted(set(byte_symbol.values()) | {s for w in words for s in w})
        )
    }
    merges = []
    while True:
        counts: dict[tuple[str, str], int] = {}
        for word in words:
            for pair in zip(word, word[1:]):
                counts[pair] = counts.get(pair, 0) + 1
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], ids[pair[0]], ids[pair[1]]))
        merged = best[0] + best[1]
        ids.setdefault(merged, len(ids))
        merges.append(best)
        words = [_merge(word, best, merged) for word in words]
    return tuple(ids), tuple(merges)


def _merge(word: list[str], pair: tuple[str, str], merged: str) -> list[str]:
    """`word` with every occurrence of `pair` replaced by `merged`, left to right."""
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(merged)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


def extend_vocab(vocab: dict[str, int], tokens: tuple[str, ...]) -> dict[str, int]:
    """`vocab` with every token it lacks appended, ids in order."""
    for token in tokens:
        vocab.setdefault(token, len(vocab))
    return vocab


def clip_tokenizer():
    """A transformers CLIPTokenizer on byte_bpe's word-level merges: the tiny CLIP families'
    tokenizer (hf_clip, and open_clip's with vocab="tiny"). End-of-text takes the highest id,
    so towers that pool at the argmax id (open_clip) find it."""
    from transformers import CLIPTokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    symbols = list(bytes_to_unicode().values())
    vocab = {token: i for i, token in enumerate(symbols + [s + "</w>" for s in symbols])}
    words, merges = byte_bpe(word_suffix="</w>")
    extend_vocab(vocab, words)
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = len(vocab), len(vocab) + 1
    return CLIPTokenizer(vocab=vocab, merges=list(merges))
