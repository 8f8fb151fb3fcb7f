"""`/v1` HTTP handlers: thin, the behaviour lives in ``services``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import MediaType, Request, Response, delete, get, post
from litestar.di import Provide
from litestar.params import Parameter, SkipValidation
from litestar.response import Stream

from kiln_platform.admission.deps import provide_admission, provide_scheduled
from kiln_platform.admission.services import Admission
from kiln_platform.context import Kiln
from kiln_platform.gateway import (
    anthropic_models,
    classify,
    cohere,
    completions,
    llm,
    responses,
    scoring,
    services,
    tokens,
)
from kiln_platform.gateway.anthropic_models import (
    VERSION_HEADER,
    AnthropicModel,
    AnthropicModelPage,
)
from kiln_platform.gateway.auth import authenticated, provide_principal
from kiln_platform.gateway.background import Feed
from kiln_platform.gateway.llm_schemas import (
    CompletionRequest,
    TextCompletion,
)
from kiln_platform.gateway.responses_schemas import (
    InputTokensRequest,
    ResponseObject,
    ResponsesRequest,
)
from kiln_platform.gateway.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    ModelCard,
    ModelList,
)
from kiln_platform.openapi import OPENAI_ERRORS, DocumentedController
from kiln_platform.registry import lifecycle

SSE = "text/event-stream"
# Already-built objects: skip Litestar's per-request validation of their fields.
KilnDep = SkipValidation[Kiln]
AdmissionDep = SkipValidation[Admission]
SCHEDULED = {"admission": Provide(provide_scheduled)}


class OpenAIController(DocumentedController):
    """The OpenAI-compatible API."""

    errors = OPENAI_ERRORS

    path = "/v1"
    guards = [authenticated]  # noqa: RUF012
    dependencies = {  # noqa: RUF012
        "principal": Provide(provide_principal),
        "admission": Provide(provide_admission),
    }

    @get("/models")
    async def list_models(
        self, request: Request[Any, Any, Any], kiln: KilnDep, admission: AdmissionDep
    ) -> ModelList | AnthropicModelPage:
        """List served models (in Anthropic's shape, paged, for an ``anthropic-version``
        caller: ``anthropic_models``)."""
        cards = await services.model_cards(kiln, admission.principal.tenant_id)
        if VERSION_HEADER in request.headers:
            return anthropic_models.page(cards, request.query_params)
        return ModelList(data=cards)

    @get("/models/{model_id:str}")
    async def get_model(
        self, request: Request[Any, Any, Any], kiln: KilnDep, admission: AdmissionDep,
        model_id: str,
    ) -> Response[ModelCard | AnthropicModel]:  # fmt: skip
        """Describe one model (or one of the tenant's adapters, ``<model>:<adapter>``)."""
        card, version = await services.describe(kiln, admission.principal.tenant_id, model_id)
        described = (anthropic_models.model_of(card) if VERSION_HEADER in request.headers
                     else card)  # fmt: skip
        return Response(described, headers=lifecycle.headers(version))

    @post("/embeddings", status_code=200, dependencies=SCHEDULED)
    async def embeddings(
        self, kiln: KilnDep, admission: AdmissionDep, data: EmbeddingsRequest
    ) -> Response[EmbeddingsResponse]:
        """Create embeddings."""
        result, version = await services.embed(kiln, admission, data)
        return Response(result, headers=lifecycle.headers(version))

    # Litestar's Stream takes the handler's media type over its own, hence media_type=SSE here
    # and an explicit JSON Response for the non-streamed case. (``POST /v1/chat/completions``
    # is in ``chat_routes``, with the stored completions' reads: one controller a path.)
    @post("/completions", status_code=200, media_type=SSE, dependencies=SCHEDULED)
    async def text_completions(
        self, kiln: KilnDep, admission: AdmissionDep, data: CompletionRequest
    ) -> Response[TextCompletion] | Stream:
        """Create a text completion (``stream: true`` for server-sent events)."""
        gen = await llm.prepare(kiln, admission, data)
        if data.stream:
            return completions.streamed(gen, completions.stream_text(gen, data.stream_options))
        body = await completions.complete_text(gen, data.prompt_logprobs)
        return Response(body, media_type=MediaType.JSON, headers=lifecycle.headers(gen.version))

    @post("/responses", status_code=200, media_type=SSE, dependencies=SCHEDULED)
    async def create_response(
        self, kiln: KilnDep, admission: AdmissionDep, data: ResponsesRequest
    ) -> Response[ResponseObject] | Stream:
        """Create a model response (the Responses API on the chat path; ``stream: true`` for
        its typed server-sent events; ``background: true`` to answer at once and run on). Kept
        only with ``store: true`` (then ``previous_response_id`` goes on from it); else send the
        history as input items."""
        if data.background:
            started = await responses.background(kiln, admission, data)
            if isinstance(started, Feed):  # its events; the run goes on if the client leaves
                return Stream(started.after(-1), media_type=SSE)
            return Response(started, media_type=MediaType.JSON)
        gen, history = await responses.prepare(kiln, admission, data)
        if data.stream:
            return completions.streamed(gen, responses.stream(gen, data, history))
        body = await responses.complete(gen, data, history)
        return Response(body, media_type=MediaType.JSON, headers=lifecycle.headers(gen.version))

    @post("/responses/input_tokens", status_code=200)
    async def count_input_tokens(
        self, kiln: KilnDep, admission: AdmissionDep, data: InputTokensRequest
    ) -> dict[str, Any]:
        """The tokens a response's input would take (history, instructions and tools
        included, as the model's chat template renders them); nothing is run or billed."""
        tokens = await responses.input_tokens(kiln, admission, data.as_response())
        return {"object": "response.input_tokens", "input_tokens": tokens}

    @get("/responses/{response_id:str}", media_type=MediaType.JSON)
    async def get_response(
        self, kiln: KilnDep, admission: AdmissionDep, response_id: str, *,
        stream: bool = False, starting_after: Annotated[int, Parameter(ge=-1)] = -1,
    ) -> dict[str, Any] | Stream:  # fmt: skip
        """A response created with ``store: true`` (a background one as it stands: poll it
        until its status is neither ``queued`` nor ``in_progress``); with ``stream``, a
        streamed background response's events after number ``starting_after``."""
        tenant = admission.principal.tenant_id
        if stream:
            events = await kiln.background.resume(tenant, response_id, starting_after)
            return Stream(events, media_type=SSE)
        return await kiln.responses.fetch(tenant, response_id)

    @get("/responses/{response_id:str}/input_items")
    async def response_input_items(
        self, kiln: KilnDep, admission: AdmissionDep, response_id: str, *,
        after: str | None = None, limit: Annotated[int, Parameter(ge=1, le=100)] = 20,
        order: Literal["asc", "desc"] = "desc",
    ) -> dict[str, Any]:  # fmt: skip
        """The input items a stored response answered (those it went on from first)."""
        return await kiln.responses.input_items(
            admission.principal.tenant_id, response_id, after=after, limit=limit, order=order
        )

    @post("/responses/{response_id:str}/cancel", status_code=200)
    async def cancel_response(
        self, kiln: KilnDep, admission: AdmissionDep, response_id: str
    ) -> dict[str, Any]:
        """Cancel a background response still queued or in progress (one that ended is
        answered as it is)."""
        return await kiln.background.cancel(admission.principal.tenant_id, response_id)

    @delete("/responses/{response_id:str}", status_code=200)
    async def delete_response(
        self, kiln: KilnDep, admission: AdmissionDep, response_id: str
    ) -> dict[str, Any]:
        """Delete a stored response."""
        return await kiln.responses.remove(admission.principal.tenant_id, response_id)


class VllmController(DocumentedController):
    """vLLM's own routes: ``/tokenize`` and ``/detokenize``, a model's tokens without a
    generation (nothing is run or billed), and score, rerank and classify, each at the root as
    vLLM documents it and under ``/v1``."""

    errors = OPENAI_ERRORS
    guards = [authenticated]  # noqa: RUF012
    dependencies = {  # noqa: RUF012
        "principal": Provide(provide_principal),
        "admission": Provide(provide_admission),
    }

    @post("/tokenize", status_code=200)
    async def tokenize(
        self, kiln: KilnDep, admission: AdmissionDep, data: tokens.TokenizeRequest
    ) -> tokens.TokenizeResponse:
        """A prompt's (or a chat's) token ids, as a completion of the model tokenizes it."""
        return await tokens.tokenize(kiln, admission, data)

    @post("/detokenize", status_code=200)
    async def detokenize(
        self, kiln: KilnDep, admission: AdmissionDep, data: tokens.DetokenizeRequest
    ) -> tokens.DetokenizeResponse:
        """The text of token ids of the model."""
        return await tokens.detokenize(kiln, admission, data)

    @post(["/v1/score", "/score"], status_code=200, dependencies=SCHEDULED)
    async def score(
        self, kiln: KilnDep, admission: AdmissionDep, data: scoring.ScoreRequest
    ) -> scoring.ScoreResponse:
        """vLLM's score API: the cosine of ``text_1`` and each of ``text_2`` (or of each pair,
        N:N) on an embeddings model, a cross-encoder's own scores on one."""
        return await scoring.score(kiln, admission, data)

    @post(["/v1/rerank", "/rerank", "/v2/rerank"], status_code=200, dependencies=SCHEDULED)
    async def rerank(
        self, kiln: KilnDep, admission: AdmissionDep, data: scoring.RerankRequest
    ) -> scoring.RerankResponse:
        """Jina's and Cohere's rerank API (as vLLM serves it, Cohere's v2 at ``/v2/rerank``):
        ``documents`` by their score against ``query``, the best ``top_n``."""
        return await scoring.rerank(kiln, admission, data)

    @post(["/v1/embed", "/v2/embed"], status_code=200, dependencies=SCHEDULED)
    async def cohere_embed(
        self, request: Request[Any, Any, Any], kiln: KilnDep, admission: AdmissionDep,
        data: cohere.EmbedRequest,
    ) -> cohere.EmbedResponse:  # fmt: skip
        """Cohere's embed API (``ClientV2.embed`` at ``/v2/embed``, ``Client.embed`` at
        ``/v1/embed``) on an embeddings model."""
        return await cohere.embed(kiln, admission, data, v1=request.url.path.startswith("/v1/"))

    @post(["/v1/classify", "/classify"], status_code=200, dependencies=SCHEDULED)
    async def classify_texts(
        self, kiln: KilnDep, admission: AdmissionDep, data: classify.ClassifyRequest
    ) -> classify.ClassifyResponse:
        """vLLM's classification API on an imported classifier: each text's labels'
        probabilities and the most probable label."""
        return await classify.classify(kiln, admission, data)
