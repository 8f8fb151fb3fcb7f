"""A cross-encoder's rows: text pairs as the tokenizer's pair template writes them, a long pair
cut in its second text, errors naming the text; a document cut to its first tokens (Cohere's
``max_tokens_per_doc``)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from kiln_platform.errors import BadRequest
from kiln_platform.gateway.services import heads, tokenize_pairs

WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b", "c", "d", "e", "f"]
NAMES = ["query", "documents[0]", "documents[1]"]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )  # fmt: skip
    return tok


def test_rows_are_the_pair_template(tokenizer: Tokenizer) -> None:
    texts = ["a b", "c d e", "f"]
    rows = tokenize_pairs(texts, tokenizer, 64, None, NAMES, pairs=[(0, 1), (0, 2)])
    assert rows == [tokenizer.encode("a b", "c d e").ids, tokenizer.encode("a b", "f").ids]


def test_truncation_cuts_the_second_text(tokenizer: Tokenizer) -> None:
    rows = tokenize_pairs(["a b", "c d e f", "f"], tokenizer, 64, 7, NAMES,
                          pairs=[(0, 1), (0, 2)])  # fmt: skip
    assert rows == [[2, 4, 5, 3, 6, 7, 3], tokenizer.encode("a b", "f").ids]


def test_errors_name_the_text(tokenizer: Tokenizer) -> None:
    with pytest.raises(BadRequest) as empty:
        tokenize_pairs(["a", "", "b"], tokenizer, 64, None, NAMES, pairs=[(0, 1)])
    assert empty.value.param == "documents[0]"
    with pytest.raises(BadRequest) as long:
        tokenize_pairs(["a", "b", "c d e f a b"], tokenizer, 8, None, NAMES, pairs=[(0, 2)])
    assert long.value.param == "documents[1]"
    with pytest.raises(BadRequest) as cut:
        tokenize_pairs(["a b c", "d"], tokenizer, 64, 4, NAMES, pairs=[(0, 1)])
    assert cut.value.param == "truncate_prompt_tokens"  # fewer than a token of each and specials
    with pytest.raises(BadRequest) as first:
        tokenize_pairs(["a b c", "d"], tokenizer, 64, 5, NAMES, pairs=[(0, 1)])
    assert first.value.param == "query"  # the query alone fills it


def test_heads_keep_each_texts_first_tokens(tokenizer: Tokenizer) -> None:
    texts = ["a  b c\td", "e f", "a", "zz b"]
    cut = heads(texts, tokenizer, 2)
    assert cut == ["a  b", "e f", "a", "zz b"]  # the whitespace between kept as it was
    assert [len(tokenizer.encode(t, add_special_tokens=False).ids) for t in cut] == [2, 2, 1, 2]
    assert heads(texts, tokenizer, 1) == ["a", "e", "a", "zz"]  # an unknown word is a token
