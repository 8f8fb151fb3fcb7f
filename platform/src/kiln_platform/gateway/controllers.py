"""`/v1` HTTP handlers: thin, the behaviour lives in ``services``."""

from __future__ import annotations

from typing import Any

from litestar import MediaType, Request, Response, get, post
from litestar.di import Provide
from litestar.params import SkipValidation
from litestar.response import Stream

from kiln_platform.context import Kiln
from kiln_platform.gateway import completions, llm, services
from kiln_platform.gateway.auth import provide_principal
from kiln_platform.gateway.dispatch import Ticket
from kiln_platform.gateway.llm_schemas import (
    ChatCompletion,
    ChatCompletionRequest,
    CompletionRequest,
    TextCompletion,
)
from kiln_platform.gateway.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    ModelCard,
    ModelList,
)
from kiln_platform.gateway.tickets import provide_ticket
from kiln_platform.keys.services import Principal
from kiln_platform.openapi import OPENAI_ERRORS, DocumentedController

SSE = "text/event-stream"
# Already-built objects: skip Litestar's per-request validation of their fields.
KilnDep = SkipValidation[Kiln]
PrincipalDep = SkipValidation[Principal]
TicketDep = SkipValidation[Ticket]


class OpenAIController(DocumentedController):
    """The OpenAI-compatible API."""

    errors = OPENAI_ERRORS

    path = "/v1"
    dependencies = {  # noqa: RUF012
        "principal": Provide(provide_principal),
        "ticket": Provide(provide_ticket),
    }

    @get("/models")
    async def list_models(self, kiln: KilnDep, principal: PrincipalDep) -> ModelList:
        """List served models."""
        return ModelList(data=await services.model_cards(kiln, principal.tenant_id))

    @get("/models/{model_id:str}")
    async def get_model(self, kiln: KilnDep, principal: PrincipalDep, model_id: str) -> ModelCard:
        """Describe one model (or one of the tenant's adapters, ``<model>:<adapter>``)."""
        return await services.describe(kiln, principal.tenant_id, model_id)

    @post("/embeddings", status_code=200)
    async def embeddings(
        self,
        request: Request[Any, Any, Any],
        kiln: KilnDep,
        principal: PrincipalDep,
        ticket: TicketDep,
        data: EmbeddingsRequest,
    ) -> EmbeddingsResponse:
        """Create embeddings."""
        return await services.embed(kiln, principal, data, request.state.request_id, ticket)

    # Litestar's Stream takes the handler's media type over its own, hence media_type=SSE here
    # and an explicit JSON Response for the non-streamed case.
    @post("/chat/completions", status_code=200, media_type=SSE)
    async def chat_completions(
        self,
        request: Request[Any, Any, Any],
        kiln: KilnDep,
        principal: PrincipalDep,
        ticket: TicketDep,
        data: ChatCompletionRequest,
    ) -> Response[ChatCompletion] | Stream:
        """Create a chat completion (``stream: true`` for server-sent events)."""
        gen = await llm.prepare(kiln, principal, data, request.state.request_id, ticket)
        if data.stream:
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            events = completions.stream_chat(gen, include_usage)
            return completions.streamed(request.scope, gen, events)
        completions.held(request.scope, gen)
        return Response(await completions.complete_chat(gen), media_type=MediaType.JSON)

    @post("/completions", status_code=200, media_type=SSE)
    async def text_completions(
        self,
        request: Request[Any, Any, Any],
        kiln: KilnDep,
        principal: PrincipalDep,
        ticket: TicketDep,
        data: CompletionRequest,
    ) -> Response[TextCompletion] | Stream:
        """Create a text completion (``stream: true`` for server-sent events)."""
        gen = await llm.prepare(kiln, principal, data, request.state.request_id, ticket)
        if data.stream:
            include_usage = bool(data.stream_options and data.stream_options.include_usage)
            events = completions.stream_text(gen, include_usage)
            return completions.streamed(request.scope, gen, events)
        completions.held(request.scope, gen)
        return Response(await completions.complete_text(gen), media_type=MediaType.JSON)
