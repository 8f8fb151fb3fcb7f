"""gpt-oss's answers in harmony's channels: ``analysis`` is the reasoning, ``final`` the
content, the markers (special tokens its chat text keeps) reach no client."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from tokenizers import AddedToken

from kiln_platform.gateway._harmony import Harmony, harmony_id
from kiln_platform.gateway._prompts import stops
from kiln_platform.gateway._textmodel import load_text_model
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest
from tests.factories import byte_bpe

ANSWER = (
    "<|channel|>analysis<|message|>User asks the capital. <b>Easy</b>.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>Paris, <i>of course</i>.<|return|>"
)
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>")


@pytest.mark.parametrize("size", [1, 3, 7, len(ANSWER)])
def test_analysis_is_reasoning_and_final_is_content_however_it_arrives(size: int) -> None:
    split = Harmony.opened(99, [1, 2])
    said = [split.push(ANSWER[i : i + size]) for i in range(0, len(ANSWER), size)]
    said.append(split.flush())
    reasoning, content = ("".join(part) for part in zip(*said, strict=True))
    assert (reasoning, content) == (
        "User asks the capital. <b>Easy</b>.",
        "Paris, <i>of course</i>.",
    )
    assert not any(marker in piece for part in said for piece in part for marker in MARKERS)
    assert (split.state, split.reasoned) == ("after", True)


def test_a_preamble_is_content_and_a_cut_reasoning_stays_reasoning() -> None:
    preamble = "<|channel|>commentary<|message|>Let me look.<|end|>"
    assert Harmony.opened(99, [1]).whole(preamble) == ("", "Let me look.")
    cut = Harmony.opened(99, [1])
    assert cut.whole("<|channel|>analysis<|message|>Hmm, the") == ("Hmm, the", "")
    assert cut.state == "inside"
    opened = Harmony.opened(99, [1, 99])  # the prompt opened the final message's body
    assert opened.whole("Paris.") == ("", "Paris.")


def test_a_harmony_tokenizer_keeps_its_markers_in_a_chats_text(tmp_path: Path) -> None:
    tok = byte_bpe(["Paris analysis final"])
    tok.add_special_tokens([AddedToken(m, special=True) for m in MARKERS])
    assert harmony_id(tok) == tok.token_to_id("<|message|>")
    assert harmony_id(byte_bpe(["Paris"])) is None
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    model = load_text_model(tmp_path, "tokenizer.json")
    assert model.harmony == tok.token_to_id("<|message|>")
    request = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
                              ChatCompletionRequest)  # fmt: skip
    assert (stops(request).skip_special, stops(request, marked=True).skip_special) == (True, False)
    text = stops(request, marked=True).stream(model.tokenizer)  # the worker's ids, one by one
    ids = model.tokenizer.encode(ANSWER.replace("capital", "Paris"), add_special_tokens=False).ids
    split, said = Harmony.opened(99, [1]), [("", "")]
    said += [split.push(text.push([token])) for token in ids] + [split.push(text.flush())]
    said.append(split.flush())
    reasoning, content = ("".join(part) for part in zip(*said, strict=True))
    assert (reasoning, content) == ("User asks the Paris. <b>Easy</b>.", "Paris, <i>of course</i>.")
