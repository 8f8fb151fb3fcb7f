"""``/v1/chat/completions``: create a chat completion, and read, tag and delete those kept
with ``store: true`` (OpenAI's stored chat completions). Thin: the generation is
``gateway.llm``, the store ``gateway.chat_store``."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec
from litestar import MediaType, Request, Response, delete, get, post
from litestar.di import Provide
from litestar.params import Parameter
from litestar.response import Stream

from kiln_platform.admission.deps import provide_admission
from kiln_platform.gateway import chat_kept, completions, llm
from kiln_platform.gateway.auth import authenticated, provide_principal
from kiln_platform.gateway.controllers import SCHEDULED, SSE, AdmissionDep, KilnDep
from kiln_platform.gateway.conversation_items import metadata_of
from kiln_platform.gateway.llm_schemas import ChatCompletion, ChatCompletionRequest
from kiln_platform.openapi import OPENAI_ERRORS, DocumentedController
from kiln_platform.registry import lifecycle

Limit = Annotated[int, Parameter(ge=1, le=100)]
METADATA_KEY = re.compile(r"metadata\[(.+)\]")
"""A metadata filter's query parameter (``metadata[key]=value``, as the SDKs send it)."""


class ChatUpdate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/chat/completions/{id}``: the metadata that replaces its own."""

    metadata: Any


def _metadata_filter(request: Request[Any, Any, Any]) -> dict[str, str]:
    """The ``metadata[key]=value`` pairs of the query, checked as metadata is."""
    pairs = {
        found.group(1): value
        for name, value in request.query_params.items()
        if (found := METADATA_KEY.fullmatch(name))
    }
    return metadata_of(pairs)


class ChatCompletionsController(DocumentedController):
    """Chat completions: created, and those stored listed, read, tagged and deleted by their
    tenant."""

    errors = OPENAI_ERRORS
    path = "/v1/chat/completions"
    guards = [authenticated]  # noqa: RUF012
    dependencies = {  # noqa: RUF012
        "principal": Provide(provide_principal),
        "admission": Provide(provide_admission),
    }

    # Litestar's Stream takes the handler's media type over its own, hence media_type=SSE here
    # and an explicit JSON Response for the non-streamed case.
    @post("/", status_code=200, media_type=SSE, dependencies=SCHEDULED)
    async def create(
        self, kiln: KilnDep, admission: AdmissionDep, data: ChatCompletionRequest
    ) -> Response[ChatCompletion] | Stream:
        """Create a chat completion (``stream: true`` for server-sent events; ``store: true``
        keeps it for the reads below)."""
        metadata_of(data.metadata)
        gen = await llm.prepare(kiln, admission, data)
        if data.stream:
            events = completions.stream_chat(gen, data.stream_options,
                                             reasoning=data.include_reasoning)  # fmt: skip
            if data.keep:
                events = chat_kept.recorded(gen, data, events)
            return completions.streamed(gen, events)
        body = await completions.complete_chat(gen, data.prompt_logprobs,
                                               reasoning=data.include_reasoning)  # fmt: skip
        await chat_kept.keep(gen, data, body)
        return Response(body, media_type=MediaType.JSON, headers=lifecycle.headers(gen.version))

    @get("/")
    async def list_completions(
        self, request: Request[Any, Any, Any], kiln: KilnDep, admission: AdmissionDep, *,
        model: str | None = None, after: str | None = None, limit: Limit = 20,
        order: Literal["asc", "desc"] = "asc",
    ) -> dict[str, Any]:  # fmt: skip
        """A page of the stored chat completions, oldest first unless ``order`` is ``desc``:
        of ``model`` and with every ``metadata[key]=value`` pair, if given."""
        return await kiln.chats.page(
            admission.principal.tenant_id, model=model, metadata=_metadata_filter(request),
            after=after, limit=limit, order=order,
        )  # fmt: skip

    @get("/{completion_id:str}")
    async def fetch(self, kiln: KilnDep, admission: AdmissionDep, completion_id: str) -> Any:
        """A stored chat completion."""
        return await kiln.chats.fetch(admission.principal.tenant_id, completion_id)

    @post("/{completion_id:str}", status_code=200)
    async def update(
        self, kiln: KilnDep, admission: AdmissionDep, completion_id: str, data: ChatUpdate
    ) -> dict[str, Any]:
        """Replace a stored chat completion's metadata."""
        tenant, metadata = admission.principal.tenant_id, metadata_of(data.metadata)
        return await kiln.chats.update(tenant, completion_id, metadata)

    @delete("/{completion_id:str}", status_code=200)
    async def remove(
        self, kiln: KilnDep, admission: AdmissionDep, completion_id: str
    ) -> dict[str, Any]:
        """Delete a stored chat completion."""
        return await kiln.chats.remove(admission.principal.tenant_id, completion_id)

    @get("/{completion_id:str}/messages")
    async def messages(
        self, kiln: KilnDep, admission: AdmissionDep, completion_id: str, *,
        after: str | None = None, limit: Limit = 20, order: Literal["asc", "desc"] = "asc",
    ) -> dict[str, Any]:  # fmt: skip
        """A page of the messages a stored chat completion answered, in the order sent unless
        ``order`` is ``desc``."""
        return await kiln.chats.messages(admission.principal.tenant_id, completion_id,
                                         after=after, limit=limit, order=order)  # fmt: skip
