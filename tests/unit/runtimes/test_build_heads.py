"""What an encoder or cross-encoder folder's sentence-transformers settings make of its build:
``do_lower_case`` in the tokenizer, a cross-encoder's activation."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from kiln_runtimes.build import BuildError
from kiln_runtimes.build._encoder import write_tokenizer
from kiln_runtimes.build._scorer import activation

if TYPE_CHECKING:
    from pathlib import Path


def test_do_lower_case_lowercases_before_the_tokenizers_own_normalizer(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, normalizers

    words = {w: i for i, w in enumerate(["[UNK]", "kiln", "Kiln", "café", "CAFÉ"])}
    cased = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    cased.normalizer = normalizers.Strip()
    cased.save(str(tmp_path / "cased.json"))
    made = write_tokenizer(tmp_path / "cased.json", tmp_path / "out.json", lowercase=True)
    assert made.encode("  Kiln").ids == [1]
    assert Tokenizer.from_file(str(tmp_path / "out.json")).encode("CAFÉ").ids == [3]
    assert write_tokenizer(tmp_path / "cased.json", tmp_path / "as.json").encode("Kiln").ids == [2]
    lowered = json.loads((tmp_path / "out.json").read_text())["normalizer"]
    write_tokenizer(tmp_path / "out.json", tmp_path / "again.json", lowercase=True)
    assert json.loads((tmp_path / "again.json").read_text())["normalizer"] == lowered  # once


@pytest.mark.parametrize(
    ("settings", "want"),
    [
        ({}, "Sigmoid"),
        ({"sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}},
         "Identity"),
        ({"sbert_ce_default_activation_function": "torch.nn.modules.activation.Tanh"}, "Tanh"),
        ({"sentence_transformers": {"activation_fn": "my_package.Scale"}}, "Sigmoid"),  # untrusted
    ],
)  # fmt: skip
def test_a_cross_encoders_activation_is_its_configs(settings: dict[str, Any], want: str) -> None:
    assert activation(SimpleNamespace(**settings)) == want


def test_an_activation_that_cannot_be_built_is_refused() -> None:
    named = {"activation_fn": "torch.nn.modules.activation.Softplus"}
    with pytest.raises(BuildError) as refused:
        activation(SimpleNamespace(sentence_transformers=named))
    assert refused.value.field == "sentence_transformers.activation_fn"
