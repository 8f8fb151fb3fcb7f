"""Structured outputs in the worker: a grammar's mask keeps every draw inside it, whatever the
sampling settings, and a sequence ends on a stop token once the grammar is complete. A small
byte-level BPE tokenizer trained here stands in for a model's."""

from __future__ import annotations

import json
from pathlib import Path

import llguidance
import numpy as np
import pytest
from tokenizers import Tokenizer

from kiln_runtimes.backends._genai_grammar import Grammars, text_added_tokens
from kiln_runtimes.backends._genai_logits import Shaping
from kiln_runtimes.backends._genai_sampling import Sampler
from kiln_runtimes.protocol import GenerateRequest
from tests.factories import byte_bpe

EOS = 0
SCHEMA = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                     "maximum": 99}},
    "required": ["ok", "n"], "additionalProperties": False,
}  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, Path]:
    tok = byte_bpe(['{"ok": true, "n": 42}', "hello world 123 false null"] * 50)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return tok, path


def _request(grammar: str | None, stops: list[int] | None = None) -> GenerateRequest:
    return GenerateRequest(
        request_id="r", prompt_ids=[1], max_tokens=200, grammar=grammar,
        stop_token_ids=[EOS] if stops is None else stops,
    )  # fmt: skip


def _grammar() -> str:
    return llguidance.LLMatcher.grammar_from_json_schema(
        SCHEMA, overrides={"whitespace_flexible": False}
    )


def _generate(tokenizer: tuple[Tokenizer, Path], **kw: object) -> str:
    tok, path = tokenizer
    vocab = tok.get_vocab_size()
    constraint = Grammars(path, vocab).constraint(_request(_grammar()))
    sampler = Sampler(constraint=constraint, **kw)  # type: ignore[arg-type]
    rng, ids = np.random.default_rng(7), list[int]()
    for _ in range(200):
        token = sampler.sample(rng.normal(0, 3, vocab).astype(np.float32))
        if token == EOS:
            return str(tok.decode(ids))
        ids.append(token)
    raise AssertionError(f"no stop token after 200 draws: {tok.decode(ids)!r}")


@pytest.mark.parametrize(
    "kw",
    [
        {"temperature": 0.0, "top_p": 1.0, "seed": None},
        *({"temperature": 1.5, "top_p": 1.0, "seed": seed} for seed in range(8)),
        {"temperature": 1.0, "top_p": 0.5, "seed": 1, "shaping": Shaping(top_k=5, min_p=0.1)},
        {"temperature": 1.0, "top_p": 1.0, "seed": 2,
         "shaping": Shaping(logit_bias={EOS: 100.0}, presence_penalty=1.0)},
    ],
)  # fmt: skip
def test_random_logits_still_write_the_schema(
    tokenizer: tuple[Tokenizer, Path], kw: dict[str, object]
) -> None:
    """Noise for logits (and a bias that would end the text at once): every answer parses and
    fits the schema, and ends on the stop token."""
    value = json.loads(_generate(tokenizer, **kw))
    assert set(value) == {"ok", "n"}
    assert isinstance(value["ok"], bool)
    assert type(value["n"]) is int
    assert 0 <= value["n"] <= 99


def test_no_grammar_no_constraint_and_a_bad_one_is_a_value_error(
    tokenizer: tuple[Tokenizer, Path],
) -> None:
    tok, path = tokenizer
    grammars = Grammars(path, tok.get_vocab_size())
    assert grammars.constraint(_request(None)) is None
    with pytest.raises(ValueError, match="stop_token_ids"):
        grammars.constraint(_request(_grammar(), stops=[]))
    with pytest.raises(ValueError, match="grammar"):
        grammars.constraint(_request('{"grammars": [{"json_schema": {"type": "frob"}}]}'))


def test_a_matcher_in_error_allows_only_the_stop_tokens(
    tokenizer: tuple[Tokenizer, Path],
) -> None:
    tok, path = tokenizer
    constraint = Grammars(path, tok.get_vocab_size()).constraint(_request(_grammar(), [EOS, 3]))
    assert constraint is not None
    first = constraint.allowed()
    assert 0 < first.sum() < first.size
    forbidden = int(np.flatnonzero(~first)[-1])
    constraint.consume(forbidden)
    assert list(np.flatnonzero(constraint.allowed())) == [EOS, 3]


def test_an_added_token_that_is_not_special_is_text_to_a_grammar(tmp_path: Path) -> None:
    """Qwen's ``<tool_call>`` and ``<think>``: a grammar takes the model's own token for the
    text where the model may choose it, and one that forces the text spells it (llguidance
    alone spelled it with that token, then refused it as special); a special token stays one."""
    from tokenizers import AddedToken

    from kiln_runtimes.backends._genai_grammar import text_added_tokens

    tok = byte_bpe(["hello world think call"] * 50)
    tok.add_tokens([AddedToken(t, special=False) for t in ("<think>", " <tool call>")])
    tok.add_special_tokens([AddedToken("<|end|>", special=True)])
    ids = tok.get_vocab(with_added_tokens=True)
    think, call, end = (ids[t] for t in ("<think>", " <tool call>", "<|end|>"))
    raw = tok.to_str()
    vocab = tok.get_vocab_size()
    plain = llguidance.LLTokenizer(raw, n_vocab=vocab, eos_token=[end])
    assert plain.is_special_token(think)  # what llguidance makes of it alone
    mended = llguidance.LLTokenizer(text_added_tokens(raw), n_vocab=vocab, eos_token=[end])
    assert not mended.is_special_token(think)
    assert mended.decode_bytes([call]) == b" <tool call>"  # its space, as the text has it
    assert mended.is_special_token(end)
    path = tmp_path / "tokenizer.json"
    path.write_text(raw)
    grammars = Grammars(path, vocab)
    chosen = grammars.constraint(_request(grammar_of("(<think>|hello)( <tool call>|x)"), [end]))
    assert chosen is not None
    assert chosen.allowed()[think]
    chosen.consume(think)
    assert chosen.allowed()[call]
    chosen.consume(call)
    assert list(np.flatnonzero(chosen.allowed())) == [end]
    forced = grammars.constraint(_request(grammar_of("<think>hello"), [end]))
    assert forced is not None
    spelled: list[int] = []
    while not (allowed := forced.allowed())[end]:
        spelled.append(int(np.flatnonzero(allowed)[0]))
        forced.consume(spelled[-1])
    assert tok.decode(spelled) == "<think>hello"


def grammar_of(regex: str) -> str:
    return llguidance.LLMatcher.grammar_from_regex(regex)


@pytest.mark.parametrize(
    ("opened", "tags"),
    [(True, ("<think>", "</think>")), (False, ("<think>", "</think>")),
     (False, ("<seed:think>", "</seed:think>"))],
    ids=["prompt-opened", "model-may-open", "seed-oss-tags"],
)  # fmt: skip
def test_a_reasoning_models_answer_follows_the_grammar_after_its_reasoning(
    tmp_path: Path, opened: bool, tags: tuple[str, str]
) -> None:
    """``_structured.after_thought``: a reasoning model writes what it likes until ``</think>``
    (after a ``<think>`` the prompt left open, or one it opens), then the schema; noise for
    logits, biased towards the tags, still ends on the stop token with the schema's JSON after
    the reasoning."""
    from tokenizers import AddedToken

    from kiln_platform.gateway._reasoning import Split, Think
    from kiln_platform.gateway._structured import after_thought

    tok = byte_bpe(['{"ok": true, "n": 42}', "hmm so the answer is"] * 50)
    tok.add_tokens([AddedToken(t, special=False) for t in tags])
    ids = tok.get_vocab(with_added_tokens=True)
    think = Think(ids[tags[0]], ids[tags[1]], *tags)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    prompt = [1, think.open_id] if opened else [1]
    vocab = tok.get_vocab_size()
    thought = []
    for seed in range(6):
        grammar = after_thought(_grammar(), think, prompt)
        constraint = Grammars(path, vocab).constraint(_request(grammar))
        sampler = Sampler(constraint=constraint, temperature=1.0, top_p=1.0, seed=seed)
        rng, drawn = np.random.default_rng(seed), list[int]()
        while len(drawn) < 400:
            logits = rng.normal(0, 3, vocab).astype(np.float32)
            logits[[think.open_id, think.close_id]] += 4.0  # the tags soon, or a long reasoning
            if (token := sampler.sample(logits)) == EOS:
                break
            drawn.append(token)
        text = tok.decode(drawn, skip_special_tokens=False)
        reasoning, content = Split.after(think, prompt).whole(text)
        assert set(json.loads(content)) == {"ok", "n"}, text
        thought.append(reasoning)
    assert any(thought)  # some answers reasoned first


CALL = '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "follows"),
    [
        (f"hmm</think>\n\n{CALL}", True),
        ("hmm</think>\n\nIt is sunny.", True),
        (f"hmm</think>{CALL}\n{CALL}", True),
        (f"hmm</think>\n\n{CALL.replace('f', 'g', 1)}", False),  # not one of the tools
        (f"hmm</think>\n\n\n\n\n\n{CALL}", True),  # words (blank too) before the first call
        (f"hmm</think>{CALL}\n\n\n\n\n\n{CALL}", False),  # a little blank space between calls
        ("hmm</think>\n\n<tool_call>\nSunny", False),  # a call, past the blank space
        (f"hmm</think>\n\n\n\n{CALL}", True),
    ],
)
def test_a_reasoning_models_tool_calls_follow_its_reasoning(
    tmp_path: Path, text: str, follows: bool
) -> None:
    """With ``auto`` tools, the answer after the reasoning (which the prompt left open) is text
    or calls, each call held to its function's schema."""
    from tokenizers import AddedToken

    from kiln_platform.gateway._reasoning import Think
    from kiln_platform.gateway._structured import _compile, after_thought
    from kiln_platform.gateway._tools import plan

    tok = byte_bpe([CALL, "hmm it is sunny"] * 50)
    tok.add_tokens([AddedToken(t, special=False) for t in ("<think>", "</think>")])
    ids = tok.get_vocab(with_added_tokens=True)
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    tools = plan([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer"}}}}}], "auto", None)  # fmt: skip
    assert tools is not None
    grammar = after_thought(_compile(*tools.constraint(), "tools"), Think(ids["<think>"],
                            ids["</think>"]), [1, ids["<think>"]])  # fmt: skip
    ll = llguidance.LLTokenizer(text_added_tokens(path.read_text()), n_vocab=tok.get_vocab_size(),
                                eos_token=[EOS])  # fmt: skip
    assert grammar is not None
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    assert (matcher.consume_tokens(ll.tokenize_str(text)) and matcher.is_accepting()) is follows


def test_mistrals_special_call_token_opens_its_calls_in_the_worker(tmp_path: Path) -> None:
    """Mistral's calls open with ``[TOOL_CALLS]``, a special token (named by id in the
    gateway's grammar): drawn, the mask holds the rest to the JSON list of calls, whatever the
    logits; not drawn, the answer is text."""
    from tokenizers import AddedToken

    from kiln_platform.gateway._call_formats import Mistral
    from kiln_platform.gateway._structured import _compile
    from kiln_platform.gateway._tools import plan

    tok = byte_bpe(['[{"name": "f", "arguments": {"x": 1}}]', "it is sunny"] * 50)
    tok.add_special_tokens([AddedToken("[TOOL_CALLS]", special=True)])
    marker = tok.get_vocab(with_added_tokens=True)["[TOOL_CALLS]"]
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    tools = plan([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9}},
        "required": ["x"]}}}], "auto", False)  # fmt: skip
    assert tools is not None
    grammar = _compile(*tools.written(Mistral(marker)).constraint(), "tools")
    vocab = tok.get_vocab_size()
    for seed in range(4):
        ids = _drawn(Grammars(path, vocab), vocab, grammar, seed, marker)
        assert ids[0] == marker
        (call,) = json.loads(tok.decode(ids[1:]))
        assert call["name"] == "f"
        assert set(call["arguments"]) == {"x"}


@pytest.mark.parametrize(
    ("name", "tags"),
    [("SEED", ("<seed:tool_call>", "</seed:tool_call>")),
     ("GLM", ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
              "</arg_value>")),
     ("MINIMAX", ("<minimax:tool_call>", "</minimax:tool_call>")),
     ("GLM47*", ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>",
                 "</arg_value>")),
     ("Apertus", ("<|tools_prefix|>", "<|tools_suffix|>")),
     ("Pythonic", ("<|tool_call_start|>", "<|tool_call_end|>"))],
)  # fmt: skip
def test_tag_shaped_calls_are_drawn_through_their_added_tokens(
    tmp_path: Path, name: str, tags: tuple[str, ...]
) -> None:
    """Seed-OSS's, GLM's and MiniMax-M2's tags are added tokens their text shows, Apertus's
    and LFM2's special ones (which their chat's text keeps), and GLM's may be: once the
    opening tag is drawn, the mask holds the rest to a call of an offered function, whatever
    the logits, and the call reads back with its arguments typed."""
    from tokenizers import AddedToken

    from kiln_platform.gateway import _call_formats, _python_calls, _tagged_calls
    from kiln_platform.gateway._structured import _compile
    from kiln_platform.gateway._tools import plan

    tok = byte_bpe(["<function=f>\n<parameter=x>", '<invoke name="f">', "it is sunny"] * 50)
    made_by = {"Apertus": _call_formats.Apertus, "Pythonic": _python_calls.Pythonic}.get(name)
    special = made_by is not None or name.endswith("*")  # GLM-4.7's tags as special tokens
    tok.add_tokens([AddedToken(t, special=special) for t in tags])
    vocabulary = tok.get_vocab(with_added_tokens=True)
    opening = vocabulary[tags[0]]
    call_format = (made_by(opening, vocabulary[tags[1]]) if made_by
                   else getattr(_tagged_calls, name.rstrip("*")).spoken(tok))  # fmt: skip
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    tools = plan([{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 9},
                                         "s": {"type": "string", "maxLength": 8}},
        "required": ["x"]}}}], "auto", False)  # fmt: skip
    assert tools is not None
    made = tools.written(call_format)
    grammar = _compile(*made.constraint(), "tools")
    vocab = tok.get_vocab_size()
    for seed in range(4):
        ids = _drawn(Grammars(path, vocab), vocab, grammar, seed, opening)
        text = tok.decode(ids, skip_special_tokens=False)
        assert ids[0] == opening, text
        (call,) = made.calls(text, "c") or []
        assert call.function.name == "f", text
        arguments = json.loads(call.function.arguments)
        assert isinstance(arguments["x"], int), text
        assert set(arguments) <= {"x", "s"}, text


def _drawn(grammars: Grammars, vocab: int, grammar: str, seed: int, first: int) -> list[int]:
    """Up to 300 tokens drawn under ``grammar`` from noise for logits, ``first`` biased (the
    token that opens a call)."""
    constraint = grammars.constraint(_request(grammar))
    assert constraint is not None
    sampler = Sampler(constraint=constraint, temperature=1.0, top_p=1.0, seed=seed,
                      shaping=Shaping(logit_bias={first: 100.0}))  # fmt: skip
    rng, ids = np.random.default_rng(seed), list[int]()
    for _ in range(300):
        if (token := sampler.sample(rng.normal(0, 3, vocab).astype(np.float32))) == EOS:
            break
        ids.append(token)
    return ids
