"""gpt-oss's answers in harmony's channels: ``analysis`` is the reasoning, ``final`` the
content, the markers (special tokens its chat text keeps) reach no client."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from tokenizers import AddedToken, Tokenizer

from kiln_platform.gateway._call_formats import HarmonyCalls
from kiln_platform.gateway._harmony import Harmony, harmony_ids
from kiln_platform.gateway._prompts import stops
from kiln_platform.gateway._structured import _compile, after_analysis, after_thought
from kiln_platform.gateway._taught import taught
from kiln_platform.gateway._textmodel import load_text_model
from kiln_platform.gateway._tools import ToolPlan, plan
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
    ids = harmony_ids(tok)
    assert ids == tuple(tok.token_to_id(m) for m in ("<|start|>", "<|channel|>", "<|message|>",
                                                     "<|end|>"))  # fmt: skip
    assert harmony_ids(byte_bpe(["Paris"])) is None
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    model = load_text_model(tmp_path, "tokenizer.json")
    assert model.harmony == ids
    request = msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "Hi"}]},
                              ChatCompletionRequest)  # fmt: skip
    assert (stops(request).skip_special, stops(request, marked=True).skip_special) == (True, False)
    text = stops(request, marked=True).stream(model.tokenizer)  # the worker's ids, one by one
    tokens = model.tokenizer.encode(ANSWER.replace("capital", "Paris"), add_special_tokens=False)
    split, said = Harmony.opened(99, [1]), [("", "")]
    said += [split.push(text.push([token])) for token in tokens.ids] + [split.push(text.flush())]
    said.append(split.flush())
    reasoning, content = ("".join(part) for part in zip(*said, strict=True))
    assert (reasoning, content) == ("User asks the Paris. <b>Easy</b>.", "Paris, <i>of course</i>.")


@pytest.mark.parametrize(
    ("text", "follows"),
    [
        ('<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>'
         '{"a": 1}', True),
        ('<|channel|>final<|message|>{"a": 1}', True),  # no reasoning
        ('<|channel|>final<|message|>hmm', False),
        ('{"a": 1}', False),  # the final message's, not the header's place
    ],
)  # fmt: skip
def test_a_structured_output_holds_the_final_message_after_the_analysis(
    text: str, follows: bool
) -> None:
    """vLLM's structured outputs start after gpt-oss's reasoning: the grammar is the final
    channel's message's, after an analysis message the model may write freely."""
    import llguidance

    from kiln_platform.gateway._structured import JSON_STYLE
    from tests.factories import accepts

    tok = byte_bpe(['{"a": 1} analysis final assistant hmm'] * 20)
    tok.add_special_tokens([AddedToken(m, special=True) for m in MARKERS])
    ids = harmony_ids(tok)
    assert ids is not None
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    answer = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_STYLE)
    assert accepts(tok, after_analysis(answer, ids), text) is follows
    assert Harmony.opened(ids[2], [1]).whole('{"a": 1}') == ("", '{"a": 1}')  # no header


CALLS = (*MARKERS, "<|constrain|>")
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
HEAD = "<|channel|>analysis<|message|>hmm<|end|><|start|>assistant"
CALL = '<|channel|>commentary to=functions.weather <|constrain|>json<|message|>{"city": "Oslo"}'


@pytest.fixture(scope="module")
def harmony_tokenizer() -> Tokenizer:
    tok = byte_bpe([CALL, HEAD, "It is sunny final commentary"] * 20)
    tok.add_special_tokens([AddedToken(m, special=True) for m in CALLS])
    return tok


def _tools(tok: Tokenizer) -> ToolPlan:
    made = plan([{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}],
                "auto", None)  # fmt: skip
    assert made is not None
    found = taught("{{ tools }}", tok)
    assert isinstance(found, HarmonyCalls)
    return made.written(found)


@pytest.mark.parametrize(
    ("text", "follows"),
    [
        (f"{HEAD}{CALL}", True),
        (CALL, True),
        (f"{HEAD}<|channel|>final<|message|>It is sunny.", True),
        (f"<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant{CALL}", True),
        (CALL.replace("weather", "time"), False),  # not one of the tools
        (CALL.replace("city", "town"), False),  # its arguments held to the schema
        ("It is sunny.", False),  # a header first
    ],
)
def test_gpt_oss_calls_are_commentary_messages_to_a_function(
    harmony_tokenizer: Tokenizer, text: str, follows: bool
) -> None:
    from tests.factories import accepts

    kind, lark = _tools(harmony_tokenizer).constraint()
    grammar = _compile(kind, lark, "tools")
    ids = harmony_ids(harmony_tokenizer)
    assert after_thought(grammar, None, [1], ids) == grammar  # it writes the messages itself
    assert accepts(harmony_tokenizer, grammar, text) is follows


def test_a_gpt_oss_call_reads_back_with_its_preamble_as_content(
    harmony_tokenizer: Tokenizer,
) -> None:
    preamble = "<|channel|>commentary<|message|>Let me look.<|end|><|start|>assistant"
    reasoning, content = Harmony.opened(99, [1]).whole(f"{HEAD}{preamble}{CALL}")
    assert reasoning == "hmm"
    made = _tools(harmony_tokenizer)
    calls = made.calls(content, "c") or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("weather", {"city": "Oslo"})]  # fmt: skip
    assert made.preface(content) == "Let me look."


def test_the_analysis_tokens_are_the_reasoning_tokens(harmony_tokenizer: Tokenizer) -> None:
    """``usage``'s ``reasoning_tokens``: the analysis messages' tokens, markers and all, known
    for good once another channel's message begins."""
    from kiln_platform.gateway._harmony import analysis_tokens

    ids = harmony_ids(harmony_tokenizer)
    assert ids is not None

    def tokens(text: str) -> list[int]:
        return list(harmony_tokenizer.encode(text, add_special_tokens=False).ids)

    thought = tokens("<|channel|>analysis<|message|>hmm<|end|>")
    final = tokens("<|start|>assistant<|channel|>final<|message|>It is sunny.")
    assert analysis_tokens(thought + final, ids, harmony_tokenizer) == (len(thought), True)
    assert analysis_tokens(thought[:-1], ids, harmony_tokenizer) == (len(thought) - 1, False)
    assert analysis_tokens(final[2:], ids, harmony_tokenizer) == (0, True)
    assert analysis_tokens(tokens("It is"), ids, harmony_tokenizer) == (0, True)
