"""vLLM's ``/v1/score`` and the Jina/Cohere-style ``/v1/rerank`` (and Cohere's v2 at
``/v2/rerank``), as vLLM answers them: on an
embeddings model a pair's score is the cosine of its two texts' vectors; on a cross-encoder
(a one-label sequence classifier) it is the model's own score of the pair, the sigmoid of its
logit, as sentence-transformers' ``CrossEncoder.predict``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import _matryoshka, services
from kiln_platform.gateway.schemas import EmbeddingsUsage as Usage

if TYPE_CHECKING:
    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln


class ScoreRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/score``: ``text_1`` against each of ``text_2`` (1:1, 1:N), or pairwise
    (N:N)."""

    model: str
    text_1: str | list[str]
    text_2: str | list[str]
    truncate_prompt_tokens: int | None = None
    user: str | None = None


class RerankRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /v1/rerank`` (and ``/v2/rerank``): ``documents`` ordered by relevance to
    ``query``."""

    model: str
    query: str
    documents: list[str | dict[str, Any]]
    """Texts, or objects (Jina's and Cohere's v1): their ``rank_fields`` are what is ranked."""
    rank_fields: list[str] | None = None
    """Cohere's v1: the keys of object documents ranked (``None``: ``text``); several are
    ranked as ``key: value`` lines, in this order."""
    top_n: int | None = None
    """The best this many (``None`` or 0: all)."""
    return_documents: bool = True
    max_tokens_per_doc: int | None = None
    """Cohere's v2: each document cut after its first this many tokens (``None``: whole)."""
    truncate_prompt_tokens: int | None = None
    user: str | None = None


class Score(msgspec.Struct, kw_only=True):
    """One pair's cosine."""

    index: int
    score: float
    object: str = "score"


class ScoreResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/score`` response: a score per pair, in order."""

    id: str
    created: int
    model: str
    data: list[Score]
    usage: Usage
    object: str = "list"


class Ranked(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One document of a rerank: its place in ``documents``, its cosine to the query."""

    index: int
    relevance_score: float
    document: dict[str, Any] | None = None
    """The document as given (a text as ``{"text": ...}``), unless ``return_documents`` is
    false."""


class RerankResponse(msgspec.Struct, kw_only=True):
    """``POST /v1/rerank`` response: the best first."""

    id: str
    model: str
    results: list[Ranked]
    usage: Usage


def listed(value: str | list[str], field: str) -> list[str]:
    """A text or texts, as a non-empty list."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise BadRequest(f"'{field}' must not be empty.", param=field)
    return value


def pairing(first: list[str], second: list[str]) -> list[tuple[int, int]]:
    """Which rows of ``first + second`` each score compares: 1:1, 1:N or N:N, as vLLM pairs."""
    n = len(first)
    if n == 1:
        return [(0, 1 + j) for j in range(len(second))]
    if n != len(second):
        raise BadRequest(
            f"'text_2' has {len(second)} texts and 'text_1' {n}; give one 'text_1' or as many "
            "as 'text_2' (1:N or N:N).", param="text_2",
        )  # fmt: skip
    return [(i, n + i) for i in range(n)]


def cosines(vectors: np.ndarray, pairs: list[tuple[int, int]]) -> list[float]:
    """The cosine of each pair of rows (0 for a zero vector)."""
    unit = _matryoshka.unit(vectors)
    left, right = (np.asarray(side, dtype=np.intp) for side in zip(*pairs, strict=True))
    return [float(x) for x in np.einsum("ij,ij->i", unit[left], unit[right])]


def _scores(done: services.Encoded, pairs: list[tuple[int, int]]) -> list[float]:
    """Each pair's score: a cross-encoder's own, else the cosine of its texts' vectors."""
    if done.scored:
        return [float(x) for x in done.vectors[:, 0]]
    return cosines(done.vectors, pairs)


def _names(field: str, value: str | list[str], count: int) -> list[str]:
    return [field] if isinstance(value, str) else [f"{field}[{i}]" for i in range(count)]


def _text(document: str | dict[str, Any], index: int, fields: list[str]) -> str:
    """What a rerank ranks of one document: a text itself; of an object, its ``fields`` (one:
    its value; several: ``key: value`` lines, as Cohere asks structured documents to be sent)."""
    if isinstance(document, str):
        return document
    values = []
    for field in fields:
        value = document.get(field)
        if value is None:
            raise BadRequest(f"'documents[{index}]' has no '{field}' to rank.",
                             param=f"documents[{index}].{field}")  # fmt: skip
        values.append(value if isinstance(value, str) else msgspec.json.encode(value).decode())
    if len(fields) == 1:
        return values[0]
    return "\n".join(f"{field}: {value}" for field, value in zip(fields, values, strict=True))


def _fits(kiln: Kiln, texts: int, field: str) -> None:
    most = services.max_inputs(kiln.settings)
    if texts > most:
        raise BadRequest(f"'{field}' makes {texts} texts to embed; at most {most}.", param=field)


async def score(kiln: Kiln, admission: Admission, request: ScoreRequest) -> ScoreResponse:
    """Serve ``POST /v1/score``; its admission records the usage."""
    first, second = listed(request.text_1, "text_1"), listed(request.text_2, "text_2")
    pairs = pairing(first, second)
    _fits(kiln, len(first) + len(second), "text_2")
    names = [*_names("text_1", request.text_1, len(first)),
             *_names("text_2", request.text_2, len(second))]  # fmt: skip
    done = await services.encode(
        kiln, admission, request.model, [*first, *second], endpoint="score",
        truncate=request.truncate_prompt_tokens, names=names, pairs=pairs,
    )  # fmt: skip
    data = [Score(index=i, score=s) for i, s in enumerate(_scores(done, pairs))]
    return ScoreResponse(
        id=f"score-{admission.request_id.removeprefix('req_')}", created=int(time.time()),
        model=request.model, data=data, usage=Usage(prompt_tokens=done.tokens,
                                                    total_tokens=done.tokens),
    )  # fmt: skip


def _given(document: str | dict[str, Any]) -> dict[str, Any]:
    return {"text": document} if isinstance(document, str) else document


async def rerank(kiln: Kiln, admission: Admission, request: RerankRequest) -> RerankResponse:
    """Serve ``POST /v1/rerank``; its admission records the usage."""
    if not request.documents:
        raise BadRequest("'documents' must not be empty.", param="documents")
    if request.top_n is not None and request.top_n < 0:
        raise BadRequest("'top_n' must be 0 (all) or more.", param="top_n")
    if request.max_tokens_per_doc is not None and request.max_tokens_per_doc < 1:
        raise BadRequest("'max_tokens_per_doc' must be 1 or more.", param="max_tokens_per_doc")
    if request.rank_fields is not None and not request.rank_fields:
        raise BadRequest("'rank_fields' must not be empty.", param="rank_fields")
    fields = request.rank_fields or ["text"]
    texts = [_text(d, i, fields) for i, d in enumerate(request.documents)]
    _fits(kiln, 1 + len(texts), "documents")
    names = ["query", *_names("documents", texts, len(texts))]
    pairs = pairing([request.query], texts)
    done = await services.encode(
        kiln, admission, request.model, [request.query, *texts], endpoint="rerank",
        truncate=request.truncate_prompt_tokens, names=names, pairs=pairs,
        clip=request.max_tokens_per_doc,
    )  # fmt: skip
    scores = _scores(done, pairs)
    order = sorted(range(len(texts)), key=lambda j: -scores[j])[: request.top_n or None]
    results = [
        Ranked(index=j, relevance_score=scores[j], document=_given(request.documents[j])
               if request.return_documents else None)
        for j in order
    ]  # fmt: skip
    return RerankResponse(
        id=f"rerank-{admission.request_id.removeprefix('req_')}", model=request.model,
        results=results, usage=Usage(prompt_tokens=done.tokens, total_tokens=done.tokens),
    )  # fmt: skip
