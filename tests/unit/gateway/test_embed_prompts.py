"""A sentence-transformers model's prompts: the named or default prefix each text is embedded
after, as ``SentenceTransformer.encode`` does; an unknown name is a 400 naming the field."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from kiln_platform.errors import BadRequest
from kiln_platform.gateway.services import prompt_of, tokenize_input
from kiln_platform.registry.services import ResolvedVersion
from kiln_runtimes.protocol import ModelManifest

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "query", "passage", ":", "a", "b"]


def _version(prompts: dict[str, str], default: str | None = None) -> ResolvedVersion:
    manifest = ModelManifest(name="m", task="embeddings", engine="onnxruntime", dimensions=4,
                             prompts=prompts, default_prompt_name=default)  # fmt: skip
    return ResolvedVersion(
        "m", "1", "sha256:" + "ab12" * 16, manifest, datetime(2026, 1, 1, tzinfo=UTC)
    )


def test_a_named_prompt_else_the_default_else_none() -> None:
    prompts = {"query": "query: ", "passage": "passage: "}
    assert prompt_of(_version(prompts, "query"), None) == "query: "
    assert prompt_of(_version(prompts, "query"), "passage") == "passage: "
    assert prompt_of(_version(prompts), None) == ""
    assert prompt_of(_version({}), None) == ""


@pytest.mark.parametrize(("prompts", "known"), [({"query": "q: "}, "(query)"), ({}, "(none)")])
def test_an_unknown_prompt_name_is_refused(prompts: dict[str, str], known: str) -> None:
    with pytest.raises(BadRequest) as refused:
        prompt_of(_version(prompts), "document")
    assert refused.value.param == "prompt_name"
    assert known in refused.value.message


@pytest.mark.parametrize("raw", [[7, 8], [[7, 8], [9]]])
def test_a_prompt_name_for_token_ids_is_refused(raw: list[object]) -> None:
    version = _version({"query": "q: "}, "query")
    assert prompt_of(version, None, raw) == "q: "  # the default: for the texts there are none
    with pytest.raises(BadRequest) as refused:
        prompt_of(version, "query", raw)
    assert refused.value.param == "prompt_name"


def test_texts_are_tokenized_after_the_prefix_and_ids_are_not() -> None:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    assert tokenize_input(["a b", "b"], tok, 16, prefix="query: ") == [
        [2, 4, 6, 7, 8, 3], [2, 4, 6, 8, 3],
    ]  # fmt: skip
    assert tokenize_input([7, 8], tok, 16, prefix="query: ") == [[7, 8]]
    with pytest.raises(BadRequest) as empty:  # an empty text stays an error, prompt or not
        tokenize_input(["a", ""], tok, 16, prefix="query: ")
    assert empty.value.param == "input[1]"
