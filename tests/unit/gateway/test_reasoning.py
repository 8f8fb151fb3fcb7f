"""A reasoning model's answer split into reasoning and content: whole or streamed in any
pieces alike, inside the reasoning from the start when the prompt left ``<think>`` open, and
only for tags the tokenizer shows as text."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, models

from kiln_platform.gateway._reasoning import Split, Think, reasoning_tokens, think_ids

OPEN, CLOSE = 7, 8


@pytest.mark.parametrize(
    ("state", "text", "want"),
    [
        ("start", "<think>\nhmm, cats\n</think>\n\nA cat.", ("\nhmm, cats\n", "\n\nA cat.")),
        ("start", "\n <think>a</think>b", ("a", "b")),  # whitespace before the tag
        ("start", "A cat. <think>no</think>", ("", "A cat. <think>no</think>")),  # text first
        ("start", "<thin", ("", "<thin")),  # cut inside the tag: it was never one
        ("start", "", ("", "")),
        ("inside", "still thinking", ("still thinking", "")),  # cut before it closed
        ("inside", "a</think>b</think>c", ("a", "b</think>c")),  # the first close ends it
        ("inside", "a</thi", ("a</thi", "")),
        ("after", "<think>x</think>", ("", "<think>x</think>")),
    ],
)
def test_whole_and_streamed_answers_split_alike(
    state: str, text: str, want: tuple[str, str]
) -> None:
    assert Split(state).whole(text) == want  # type: ignore[arg-type]
    for size in (1, 2, 3, 5):
        split, parts = Split(state), ["", ""]  # type: ignore[arg-type]
        for at in range(0, len(text), size):
            for i, said in enumerate(split.push(text[at : at + size])):
                parts[i] += said
        for i, said in enumerate(split.flush()):
            parts[i] += said
        assert tuple(parts) == want, size


def test_held_text_is_only_what_may_be_a_tag() -> None:
    split = Split("inside")
    assert split.push("abc</") == ("abc", "")
    assert split.push("th") == ("", "")
    assert split.push("ink>d") == ("", "d")
    split = Split()
    assert split.push("  <th") == ("", "")
    assert split.push("x") == ("", "  <thx")


@pytest.mark.parametrize(
    ("prompt", "state"),
    [
        ([1, 2, OPEN, 3], "inside"),  # DeepSeek-R1's template opens it for the model
        ([1, OPEN, 3, CLOSE, 4], "start"),  # Qwen3's enable_thinking false: closed, empty
        ([1, OPEN, CLOSE, 4, OPEN], "inside"),
        ([1, 2, 3], "start"),
    ],
)
def test_an_answer_starts_inside_when_the_prompt_left_think_open(
    prompt: list[int], state: str
) -> None:
    assert Split.after(Think(OPEN, CLOSE), prompt).state == state


def test_only_tags_the_text_shows_make_a_reasoning_model() -> None:
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    assert think_ids(tokenizer) is None
    tokenizer.add_tokens([AddedToken("<think>", special=False)])
    assert think_ids(tokenizer) is None  # one tag alone
    tokenizer.add_special_tokens([AddedToken("</think>", special=True)])
    assert think_ids(tokenizer) is None  # decoding would leave the special one out
    shown = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    shown.add_tokens([AddedToken("<think>", special=False), AddedToken("</think>", special=False)])
    assert think_ids(shown) == Think(2, 3, "<think>", "</think>")


def test_seed_oss_reasons_in_its_own_tags() -> None:
    """Seed-OSS's ``<seed:think>`` and ``</seed:think>``: its reasoning is split by them."""
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]"))
    tokenizer.add_tokens([AddedToken(t, special=False) for t in ("<seed:think>", "</seed:think>")])
    think = think_ids(tokenizer)
    assert think == Think(2, 3, "<seed:think>", "</seed:think>")
    split, said = Split.after(think, [1]), ["<seed:", "think>Hm, <think>", "</seed:th", "ink>Yes."]
    pushed = [split.push(piece) for piece in said]
    assert pushed == [("", ""), ("Hm, <think>", ""), ("", ""), ("", "Yes.")]
    assert Split.after(think, [1, 2]).whole("Hm.</seed:think>Yes.") == ("Hm.", "Yes.")


@pytest.mark.parametrize(
    ("prompt", "answer", "spent"),
    [
        ([1, OPEN], [4, 5, CLOSE, 6], 3),  # inside from the start: to the close, tag included
        ([1], [OPEN, 4, CLOSE, 6, CLOSE], 3),  # opened by the model; the first close ends it
        ([1], [9, OPEN, 4, CLOSE, 6], 4),  # opened after blank space
        ([1, OPEN], [4, 5], 2),  # cut before it closed: all of it
        ([1], [4, OPEN, 5, CLOSE], 0),  # text first: no reasoning
        ([1], [4, 5], 0),
    ],
)
def test_reasoning_tokens_run_to_the_first_close_as_the_split_splits(
    prompt: list[int], answer: list[int], spent: int
) -> None:
    text = {OPEN: "<think>", CLOSE: "</think>", 4: "a", 5: "b", 6: "c", 9: "\n"}
    split = Split.after(Think(OPEN, CLOSE), prompt)
    split.whole("".join(text[t] for t in answer))
    assert split.reasoned is (spent > 0)

    tokenizer: Any = SimpleNamespace(decode=lambda ids: "".join(text[t] for t in ids))
    assert reasoning_tokens(Think(OPEN, CLOSE), prompt, answer, tokenizer) == spent
