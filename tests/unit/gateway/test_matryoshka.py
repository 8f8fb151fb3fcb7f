"""OpenAI's ``dimensions``: a Matryoshka model's vectors cut and normalized again; any other
width of a model not trained to be cut is a 400 naming the field."""

from __future__ import annotations

import numpy as np
import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._matryoshka import cut, width
from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._pooling import matryoshka
from kiln_runtimes.protocol import ModelManifest


def _manifest(cuts: list[int] | None) -> ModelManifest:
    return ModelManifest(name="m", task="embeddings", engine="onnxruntime", dimensions=64,
                         normalize=True, matryoshka_dimensions=cuts)  # fmt: skip


@pytest.mark.parametrize(
    ("cuts", "asked", "kept"),
    [(None, None, None), (None, 64, None), ([], 16, 16), ([], 64, None), ([32, 16], 32, 32)],
)
def test_the_width_a_request_gets(
    cuts: list[int] | None, asked: int | None, kept: int | None
) -> None:
    assert width(_manifest(cuts), asked, "m") == kept


@pytest.mark.parametrize(
    ("cuts", "asked", "says"),
    [(None, 32, "not trained to be cut"), ([32, 16], 48, "one of 32, 16"), ([], 65, "from 1 to 64"),
     ([], 0, "from 1 to 64"), ([], -3, "from 1 to 64")],
)  # fmt: skip
def test_a_width_the_model_cannot_give_is_a_400_naming_dimensions(
    cuts: list[int] | None, asked: int, says: str
) -> None:
    with pytest.raises(BadRequest, match=says) as refused:
        width(_manifest(cuts), asked, "m")
    assert refused.value.param == "dimensions"


def test_cut_keeps_the_first_numbers_and_normalizes_again() -> None:
    vectors = np.random.default_rng(1).normal(size=(3, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    kept = cut(vectors, 4, normalize=True)
    assert kept.shape == (3, 4)
    assert kept.dtype == np.dtype(np.float32)
    assert np.allclose(np.linalg.norm(kept, axis=1), 1.0)
    assert np.allclose(kept * np.linalg.norm(vectors[:, :4], axis=1, keepdims=True), vectors[:, :4])
    assert np.array_equal(cut(vectors, 4, normalize=False), vectors[:, :4])


def test_the_build_reads_the_widths_from_config_json() -> None:
    assert matryoshka({}, 64) is None
    assert matryoshka({"is_matryoshka": True}, 64) == []
    assert matryoshka({"matryoshka_dimensions": [16, 64, 32, 16]}, 64) == [64, 32, 16]
    for wrong in ([128], [0], "64", [True], [16.0]):
        with pytest.raises(BuildError) as refused:
            matryoshka({"matryoshka_dimensions": wrong}, 64)
        assert (refused.value.file, refused.value.field) == ("config.json", "matryoshka_dimensions")
