"""Embeddings and model listing: validate, tokenize, dispatch, shape the OpenAI response."""

from __future__ import annotations

import base64
import dataclasses
import time
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import numpy as np
from tokenizers import Tokenizer

from kiln_platform.adapters.directory import SEPARATOR, split
from kiln_platform.billing.ledger import usage_of
from kiln_platform.billing.pricing import Quantities
from kiln_platform.errors import BadRequest, ModelNotFound
from kiln_platform.gateway import _matryoshka, metrics
from kiln_platform.gateway._offload import off_loop
from kiln_platform.gateway.schemas import (
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    ModelCard,
)
from kiln_platform.registry.artifacts import local_tree
from kiln_runtimes import tracing
from kiln_runtimes.protocol import EmbedRequest

if TYPE_CHECKING:
    import uuid
    from collections.abc import Sequence
    from pathlib import Path

    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.registry.services import ResolvedVersion
    from kiln_platform.settings import Settings

Side = Literal["left", "right"]
"""Which end of a text too long a truncation drops (``left``: its start, vLLM's)."""


def max_inputs(settings: Settings) -> int:
    """The most inputs one embeddings request may have: the API's limit, within a worker queue."""
    return min(settings.max_embedding_inputs, settings.worker_max_queue)


@lru_cache(maxsize=32)
def load_tokenizer(path: Path) -> Tokenizer:
    """The tokenizer of a model version (immutable, so cached by path)."""
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _is_ids(items: list[Any]) -> bool:
    return all(type(x) is int for x in items)


def _field(names: Sequence[str], i: int) -> str:
    return names[i] if names else f"input[{i}]"


def _sequences(
    raw: list[Any], tokenizer: Tokenizer, keep: int | None, names: Sequence[str], prefix: str,
    *, side: Side = "left",
) -> list[list[int]]:  # fmt: skip
    """Token ids per item of a non-empty ``input`` list (strings are tokenized after
    ``prefix``); with ``keep``, each item's last ``keep`` tokens at most (``side`` right: its
    first), its special tokens kept and counted."""

    def cut(ids: list[int]) -> list[int]:
        return ids if not keep else ids[-keep:] if side == "left" else ids[:keep]

    if _is_ids(raw):
        return [cut(list(raw))]
    if all(isinstance(x, str) for x in raw):
        for i, text in enumerate(raw):
            if not text:
                field = _field(names, i)
                raise BadRequest(f"'{field}' must not be an empty string.", param=field)
        raw = [prefix + text for text in raw] if prefix else raw
        if keep is None:
            return [e.ids for e in tokenizer.encode_batch(raw)]
        bare = tokenizer.encode_batch(raw, add_special_tokens=False)
        room = keep - tokenizer.num_special_tokens_to_add(False)
        for encoding in bare:
            encoding.truncate(room, direction=side)
        return [tokenizer.post_process(encoding).ids for encoding in bare]
    if all(isinstance(x, list) for x in raw):
        for i, item in enumerate(raw):
            if not item or not _is_ids(item):
                raise BadRequest(
                    f"'input[{i}]' must be a non-empty list of token ids.", param=f"input[{i}]"
                )
        return [cut(list(x)) for x in raw]
    raise BadRequest(
        "'input' must be a string, a list of strings, or a list of token-id lists.", param="input"
    )


def count_items(raw: str | list[Any], max_items: int) -> int:
    """The number of inputs, the request's fair-share cost, checked without tokenizing."""
    if isinstance(raw, str) or (raw and _is_ids(raw)):
        return 1
    if not raw:
        raise BadRequest("'input' must not be empty.", param="input")
    if len(raw) > max_items:
        raise BadRequest(f"'input' has {len(raw)} items; at most {max_items}.", param="input")
    return len(raw)


def _chars(raw: str | list[Any], count: int) -> int:
    """Characters of text ``input`` holds (none in a list of token ids)."""
    if isinstance(raw, str):
        return len(raw)
    return sum(len(x) for x in raw if isinstance(x, str)) if count > 1 else 0


def tokenize_input(
    raw: str | list[Any], tokenizer: Tokenizer, context: int, truncate: int | None = None,
    names: Sequence[str] = (), *, prefix: str = "", side: Side = "left",
) -> list[list[int]]:  # fmt: skip
    """Validate ``input`` (counted by :func:`count_items`) and return token ids per item (a
    text's after ``prefix``), each cut to its last ``truncate_prompt_tokens`` if given (``side``
    right: its first, Cohere's ``truncate: END``); errors name the field (``names[i]`` for item
    ``i`` when given)."""
    keep = kept(truncate, context, tokenizer.num_special_tokens_to_add(False) + 1)
    texts = [raw] if isinstance(raw, str) else raw
    ids = _sequences(texts, tokenizer, keep, names, prefix, side=side)
    vocab = tokenizer.get_vocab_size()
    for i, seq in enumerate(ids):
        field = _field(names, i)
        if len(seq) > context:
            raise BadRequest(
                f"'{field}' has {len(seq)} tokens; this model's context is {context} tokens.",
                param=field,
            )
        if min(seq) < 0 or max(seq) >= vocab:
            raise BadRequest(f"'{field}' has token ids outside [0, {vocab}).", param=field)
    return ids


def tokenize_pairs(
    raw: str | list[Any], tokenizer: Tokenizer, context: int, truncate: int | None,
    names: Sequence[str], *, pairs: Sequence[tuple[int, int]],
) -> list[list[int]]:  # fmt: skip
    """A cross-encoder's rows: each pair of ``raw``'s texts as the tokenizer's pair template
    writes it; with ``truncate_prompt_tokens``, a pair over it keeps its first text whole and
    the start of its second (sentence-transformers' ``only_second``). Errors name the text."""
    texts = [raw] if isinstance(raw, str) else raw
    for i, text in enumerate(texts):
        if not text:
            raise BadRequest(f"'{names[i]}' must not be an empty string.", param=names[i])
    bare = tokenizer.encode_batch(texts, add_special_tokens=False)
    specials = tokenizer.num_special_tokens_to_add(True)
    keep = kept(truncate, context, specials + 2)
    most, rows = keep or context, []
    for a, b in pairs:
        room = most - specials - len(bare[a])
        if keep is not None and room >= 1:
            bare[b].truncate(room, direction="right")
        row = tokenizer.post_process(bare[a], bare[b]).ids
        if len(row) > most:
            field = names[a] if room < 1 else names[b]  # the first text alone leaves no room
            limit = "'truncate_prompt_tokens'" if keep else "this model's context"
            raise BadRequest(
                f"'{names[a]}' and '{names[b]}' make {len(row)} tokens; {limit} is {most}.",
                param=field,
            )
        rows.append(row)
    return rows


def heads(texts: list[str], tokenizer: Tokenizer, most: int) -> list[str]:
    """Each text cut after its first ``most`` tokens (its own, special tokens aside), as
    Cohere's ``max_tokens_per_doc`` cuts a document; a shorter text is kept whole."""
    cut = []
    for text, encoding in zip(
        texts, tokenizer.encode_batch(texts, add_special_tokens=False), strict=True
    ):
        offsets = encoding.offsets
        cut.append(text[: offsets[most - 1][1]] if len(offsets) > most else text)
    return cut


def kept(value: int | None, context: int, least: int = 1) -> int | None:
    """vLLM's ``truncate_prompt_tokens`` checked: how many of its last tokens a prompt keeps
    (-1: the model's context; ``None``: all), at least ``least``."""
    if value is None:
        return None
    keep = context if value == -1 else value
    if not least <= keep <= context:
        raise BadRequest(
            f"'truncate_prompt_tokens' must be -1 or between {least} and this model's context, "
            f"{context}.", param="truncate_prompt_tokens",
        )  # fmt: skip
    return keep


@dataclasses.dataclass(frozen=True, slots=True)
class Encoded:
    """The model's rows (a vector per text; a cross-encoder's: a score per pair; a
    classifier's: each label's probability), the tokens they took and the version that made
    them."""

    vectors: np.ndarray
    tokens: int
    version: ResolvedVersion

    @property
    def scored(self) -> bool:
        """Rows are pairs' scores (a cross-encoder), not texts' vectors."""
        return self.version.manifest.scores


def _checked(version: ResolvedVersion, endpoint: str) -> None:
    """The model serves ``endpoint``: a cross-encoder pairs (score, rerank), a classifier
    classifies, any other embeddings model embeds and scores by cosine."""
    manifest, model = version.manifest, version.model
    if endpoint == "classify" and not manifest.labels:
        raise BadRequest(f"The model `{model}` is not a classifier (/v1/classify).", param="model")
    if manifest.task != "embeddings":
        raise BadRequest(f"The model `{model}` does not produce embeddings.", param="model")
    if manifest.labels and endpoint != "classify":
        raise BadRequest(
            f"The model `{model}` is a classifier: it gives each text its labels' probabilities "
            "(/v1/classify) and produces no embeddings or pair scores.", param="model",
        )  # fmt: skip
    if manifest.scores and endpoint == "embeddings":
        raise BadRequest(
            f"The model `{model}` is a cross-encoder: it scores text pairs "
            "(/v1/score, /v1/rerank) and produces no embeddings.", param="model",
        )  # fmt: skip


def prompt_of(version: ResolvedVersion, name: str | None, raw: Any = "") -> str:
    """The prefix each text of ``raw`` is embedded after, as ``SentenceTransformer.encode``:
    the prompt ``name``d (a 400 naming ``prompt_name`` if the model has none so named, or if
    ``raw`` is token ids, which are embedded as given), else the model's default, else none."""
    prompts, default = version.manifest.prompts, version.manifest.default_prompt_name
    if name is None:
        return prompts.get(default or "", "")
    if isinstance(raw, list) and raw and not any(isinstance(item, str) for item in raw):
        raise BadRequest("'prompt_name' applies to texts; token ids are embedded as given.",
                         param="prompt_name")  # fmt: skip
    if name not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise BadRequest(
            f"'prompt_name' must name a prompt of `{version.model}` ({known}), not {name!r}.",
            param="prompt_name",
        )
    return prompts[name]


async def encode(
    kiln: Kiln, admission: Admission, model: str, raw: str | list[Any], *, endpoint: str,
    truncate: int | None = None, dimensions: int | None = None, names: Sequence[str] = (),
    pairs: Sequence[tuple[int, int]] | None = None, prompt_name: str | None = None,
    clip: int | None = None, side: Side = "left",
) -> Encoded:  # fmt: skip
    """Run ``raw`` (as ``input`` of ``POST /v1/embeddings`` takes it) through an embeddings
    model or a classifier, or, on a cross-encoder, the ``pairs`` of its texts; its admission
    records the usage under ``endpoint`` (which the model must serve); texts get the model's
    prompt (:func:`prompt_of`); with ``clip``, the texts after the first (a rerank's documents)
    keep their first ``clip`` tokens (:func:`heads`); ``truncate`` keeps texts' last tokens, or
    with ``side`` right their first; ``dimensions`` cuts a Matryoshka model's vectors
    (:mod:`._matryoshka`). Errors name ``names[i]`` for item ``i``
    when given, else ``input[i]``."""
    principal, request_id = admission.principal, admission.request_id
    version = await kiln.resolver.resolve(model, str(principal.tenant_id))
    manifest = version.manifest
    _checked(version, endpoint)
    admission.serves(version.model, split=kiln.resolver.split(model, str(principal.tenant_id)))
    cut_to = _matryoshka.width(manifest, dimensions, version.model)
    prefix = prompt_of(version, prompt_name, raw)
    model_dir = await local_tree(kiln.store, version.artifact_digest)
    tokenizer = load_tokenizer(model_dir / (manifest.tokenizer_file or "tokenizer.json"))
    count = count_items(raw, max_inputs(kiln.settings))
    if clip is not None and isinstance(raw, list):  # a rerank's texts: the query, documents
        raw = [raw[0], *await off_loop(_chars(raw, count), heads, raw[1:], tokenizer, clip)]
    rows = (
        partial(tokenize_pairs, pairs=pairs)
        if manifest.scores and pairs
        else partial(tokenize_input, prefix=prefix, side=side)
    )
    with admission.screening(model):
        kiln.workers.screen(version.pool, request_id, admission.terms, count)
    with tracing.span("tokenize", {"kiln.inputs": count}):
        ids = await off_loop(
            _chars(raw, count), rows, raw, tokenizer, version.context_length, truncate, names
        )
    tokens = sum(map(len, ids))
    await admission.hold(version, Quantities(input_tokens=tokens, items=len(ids)))
    usage = usage_of(principal, version, request_id, endpoint, input_tokens=tokens, items=len(ids))
    started = time.perf_counter()
    async with admission.dispatched(usage):
        result = await kiln.workers.embed(
            version.pool, EmbedRequest(request_id=request_id, input_ids=ids), admission.terms
        )
    took_s = time.perf_counter() - started
    vectors = np.frombuffer(result.data, dtype="<f4").reshape(len(ids), result.dimensions)
    await admission.commit(
        dataclasses.replace(usage, queue_ms=result.queue_ms, compute_ms=result.compute_ms)
    )
    metrics.EMBEDDED_ITEMS.labels(version.model).inc(len(ids))
    shadow = kiln.shadows.plan(version, request_id)
    if shadow is not None:  # a copy to the candidate, after the answer is in hand
        kiln.shadows.embed(shadow, ids, vectors, took_s)
    if cut_to is not None:
        vectors = _matryoshka.cut(vectors, cut_to, normalize=bool(manifest.normalize))
    return Encoded(vectors, tokens, version)


async def embed(
    kiln: Kiln, admission: Admission, request: EmbeddingsRequest
) -> tuple[EmbeddingsResponse, ResolvedVersion]:
    """Serve ``POST /v1/embeddings`` (and say which version did)."""
    done = await encode(
        kiln, admission, request.model, request.input, endpoint="embeddings",
        truncate=request.truncate_prompt_tokens, dimensions=request.dimensions,
        prompt_name=request.prompt_name,
    )  # fmt: skip
    if request.encoding_format == "base64":
        data = [
            Embedding(index=i, embedding=base64.b64encode(v.tobytes()).decode())
            for i, v in enumerate(done.vectors)
        ]
    else:
        data = [Embedding(index=i, embedding=v.tolist()) for i, v in enumerate(done.vectors)]
    response = EmbeddingsResponse(
        data=data,
        model=request.model,
        usage=EmbeddingsUsage(prompt_tokens=done.tokens, total_tokens=done.tokens),
    )
    return response, done.version


def model_card(version: ResolvedVersion) -> ModelCard:
    """The `/v1/models` entry for a model's newest version."""
    return ModelCard(id=version.model, created=int(version.created_at.timestamp()),
                     max_model_len=version.context_length)  # fmt: skip


async def model_cards(kiln: Kiln, tenant_id: uuid.UUID) -> list[ModelCard]:
    """Served models, then the tenant's adapters (``<model>:<adapter>``, with their parent)."""
    await kiln.resolver.refresh()
    tenant = str(tenant_id)
    cards = [model_card(v) for v in kiln.resolver.listed(tenant)]
    sizes = {card.id: card.max_model_len for card in cards}
    for base, adapter, created in await kiln.adapters.names(tenant_id):
        model = f"{base}{SEPARATOR}{adapter}"
        cards.append(ModelCard(id=model, created=created, owned_by=tenant, parent=base,
                               max_model_len=sizes.get(base, msgspec.UNSET)))  # fmt: skip
    return cards


async def describe(
    kiln: Kiln, tenant_id: uuid.UUID, model: str
) -> tuple[ModelCard, ResolvedVersion]:
    """One model's card, or one of the tenant's adapters', and the version the name gives."""
    base, adapter = split(model)
    version = await kiln.resolver.resolve(base, str(tenant_id))
    card = model_card(version)
    if adapter is None:
        return card, version
    if await kiln.adapters.digest(tenant_id, version.model, adapter) is None:
        raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
    adapted = ModelCard(id=model, created=card.created, owned_by=str(tenant_id), parent=base,
                        max_model_len=card.max_model_len)  # fmt: skip
    return adapted, version
