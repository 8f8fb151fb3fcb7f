"""Cohere's embed request read: its texts (or v2 ``inputs``), the types it asks, the signs of
vectors packed as Cohere's ``binary``/``ubinary``; what Kiln cannot serve, a 400 naming it."""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway.cohere import EmbedRequest, _kinds, _texts, _typed


def _request(**fields: Any) -> EmbedRequest:
    return msgspec.convert({"model": "m", **fields}, EmbedRequest)


def test_texts_or_inputs_text_parts() -> None:
    assert _texts(_request(texts=["a", "b"])) == (["a", "b"], "texts")
    parts = [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]
    assert _texts(_request(inputs=[{"content": parts}])) == (["x\ny"], "inputs")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({}, "texts"),
        ({"texts": ["a"], "inputs": []}, "texts"),
        ({"images": ["data:image/png;base64,AA=="]}, "images"),
        ({"texts": ["a"], "input_type": "image"}, "input_type"),
        ({"inputs": [{"content": [{"type": "image_url"}]}]}, "inputs[0].content[0]"),
    ],
)
def test_what_is_not_text_is_refused_naming_it(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(BadRequest) as refused:
        _texts(_request(**fields))
    assert refused.value.param == param


def test_types_default_to_float_on_v2_and_none_on_v1() -> None:
    assert _kinds(_request(), v1=False) == ["float"]
    assert _kinds(_request(), v1=True) == []
    assert _kinds(_request(embedding_types=["ubinary", "float", "ubinary"]), v1=True) == [
        "ubinary", "float"
    ]  # fmt: skip
    with pytest.raises(BadRequest) as refused:
        _kinds(_request(embedding_types=["float", "base64"]), v1=False)
    assert refused.value.param == "embedding_types[1]"


def test_binary_types_pack_the_signs_eight_to_a_byte() -> None:
    vectors = np.array([[1.0, -1, 0.5, -0.2, 0, 3, -3, 1, 0.1, -0.1, 0, 0, 0, 0, 0, 2]])
    assert _typed(vectors, "ubinary") == [[0b10100101, 0b10000001]]
    assert _typed(vectors, "binary") == [[0b10100101 - 128, 0b10000001 - 128]]
    assert _typed(vectors, "float") == vectors.tolist()
