"""Incremental detokenization and stop strings, with a real tokenizer built in the test."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from kiln_platform.gateway._textstream import Detokenizing, TextStream


@pytest.fixture(scope="module")
def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE with single-byte tokens: multi-byte characters span several tokens."""
    vocab = {c: i for i, c in enumerate(pre_tokenizers.ByteLevel.alphabet())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return tok


def _stream(tok: Tokenizer, text: str, stop: tuple[str, ...] = ()) -> tuple[list[str], str]:
    ts = TextStream(tok, stop)
    pieces = [ts.push([i]) for i in tok.encode(text).ids]
    pieces.append(ts.flush())
    return pieces, "".join(pieces)


def test_multibyte_and_emoji_never_split(byte_tokenizer: Tokenizer) -> None:
    text = "Café 🚀 naïve 日本語 done"
    pieces, joined = _stream(byte_tokenizer, text)
    assert joined == text
    assert all("\ufffd" not in p for p in pieces)
    assert len(byte_tokenizer.encode("🚀").ids) == 4  # the test really crosses token boundaries


def test_stop_string_across_token_boundaries_is_cut(byte_tokenizer: Tokenizer) -> None:
    pieces, joined = _stream(byte_tokenizer, "The answer is 42.\nUser: more", ("\nUser:",))
    assert joined == "The answer is 42."
    assert all("\nUser" not in p for p in pieces)


def test_partial_stop_prefix_is_released_when_it_diverges(byte_tokenizer: Tokenizer) -> None:
    _, joined = _stream(byte_tokenizer, "a \nUse the force", ("\nUser:",))
    assert joined == "a \nUse the force"


def test_earliest_of_several_stops_wins(byte_tokenizer: Tokenizer) -> None:
    _, joined = _stream(byte_tokenizer, "one two three", ("three", "two"))
    assert joined == "one "


def test_stop_at_very_start_gives_empty_text(byte_tokenizer: Tokenizer) -> None:
    ts = TextStream(byte_tokenizer, ("ab",))
    out = "".join(ts.push([i]) for i in byte_tokenizer.encode("abc").ids) + ts.flush()
    assert out == ""
    assert ts.stopped


def test_include_stop_keeps_the_stop_string_that_ended_the_text(byte_tokenizer: Tokenizer) -> None:
    """vLLM's ``include_stop_str_in_output``: the earliest stop met ends the text, kept."""
    stream = Detokenizing(("three", "two"), include_stop=True).stream(byte_tokenizer)
    ids = byte_tokenizer.encode("one two three").ids
    out = "".join(stream.push([i]) for i in ids) + stream.flush()
    assert (out, stream.stopped) == ("one two", True)


def test_special_tokens_are_written_only_when_asked(byte_tokenizer: Tokenizer) -> None:
    """vLLM's ``skip_special_tokens: false`` writes a special token's text."""
    tok = Tokenizer.from_str(byte_tokenizer.to_str())
    tok.add_special_tokens(["<|sep|>"])
    special = tok.token_to_id("<|sep|>")
    assert special is not None
    ids = [*tok.encode("a").ids, special, *tok.encode("b").ids]
    for skip, want in ((True, "ab"), (False, "a<|sep|>b")):
        stream = Detokenizing(skip_special=skip).stream(tok)
        assert "".join(stream.push([i]) for i in ids) + stream.flush() == want


def test_min_tokens_holds_back_stop_strings_in_their_text(byte_tokenizer: Tokenizer) -> None:
    """vLLM's ``min_tokens``: no stop string ends the answer before that many tokens; the first
    that ends on or after it does, even if it began before."""
    ids = byte_tokenizer.encode("ab ab ab!").ids  # one token per character
    stream = Detokenizing(("ab",), min_tokens=4).stream(byte_tokenizer)
    out = "".join(stream.push([i]) for i in ids) + stream.flush()
    assert (out, stream.stopped) == ("ab ", True)  # "ab" of tokens 4 and 5
    whole = Detokenizing(("ab",), min_tokens=4).stream(byte_tokenizer)
    assert whole.push(ids) + whole.flush() == "ab "  # tokens in one chunk: the same
    for least, text, stopped in ((9, "ab ab ab", True), (10, "ab ab ab!", False)):
        late = Detokenizing(("!",), min_tokens=least).stream(byte_tokenizer)
        assert (late.push(ids) + late.flush(), late.stopped) == (text, stopped)
