"""An LLM's tensors as a generate body: each input's one value by its name (``stop_words``
and ``bad_words``: all their elements), a 400 naming an input that holds more."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway.oip_llm import body_of
from kiln_runtimes import tensor_bytes
from kiln_runtimes.protocol import Tensor


def _texts(name: str, *values: str) -> Tensor:
    return Tensor(name=name, datatype="BYTES", shape=[len(values)],
                  data=tensor_bytes.pack(values))  # fmt: skip


def test_each_input_is_its_value() -> None:
    tensors = [
        _texts("text_input", "Once upon a time"),
        Tensor(name="max_tokens", datatype="INT32", shape=[1, 1],
               data=np.array([[9]], np.int32).tobytes()),
        Tensor(name="temperature", datatype="FP32", shape=[1],
               data=np.array([0.5], np.float32).tobytes()),
        Tensor(name="stream", datatype="BOOL", shape=[1], data=np.array([True]).tobytes()),
        _texts("stop_words", "The", "end"),
        _texts("sampling_parameters", '{"top_p": 0.9}'),
    ]  # fmt: skip
    assert body_of(tensors) == {
        "text_input": "Once upon a time", "max_tokens": 9, "temperature": 0.5, "stream": True,
        "stop_words": ["The", "end"], "sampling_parameters": '{"top_p": 0.9}',
    }  # fmt: skip


def test_an_input_of_more_values_is_a_400_naming_it() -> None:
    with pytest.raises(BadRequest) as refused:
        body_of([_texts("text_input", "a", "b")])
    assert refused.value.param == "text_input"
    assert "2 values" in refused.value.message
