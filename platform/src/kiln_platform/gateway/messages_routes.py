"""``/v1/messages``: Anthropic's Messages API (``gateway.messages``), and its token count."""

from __future__ import annotations

from typing import Any

from litestar import MediaType, Response, post
from litestar.di import Provide
from litestar.response import Stream

from kiln_platform.admission.deps import provide_admission
from kiln_platform.gateway import completions, llm, messages, tokens
from kiln_platform.gateway.auth import authenticated, provide_principal
from kiln_platform.gateway.controllers import SCHEDULED, SSE, AdmissionDep, KilnDep
from kiln_platform.gateway.llm_schemas import StreamOptions
from kiln_platform.openapi import ANTHROPIC_ERRORS, DocumentedController
from kiln_platform.registry import lifecycle


class MessagesController(DocumentedController):
    """Anthropic's Messages API on Kiln's LLMs."""

    errors = ANTHROPIC_ERRORS
    path = "/v1/messages"
    guards = [authenticated]  # noqa: RUF012
    dependencies = {  # noqa: RUF012
        "principal": Provide(provide_principal),
        "admission": Provide(provide_admission),
    }

    @post("/", status_code=200, media_type=SSE, dependencies=SCHEDULED)
    async def create(
        self, kiln: KilnDep, admission: AdmissionDep, data: messages.MessagesRequest
    ) -> Response[Any] | Stream:
        """Create a message (``stream: true`` for Anthropic's server-sent events)."""
        chat = messages.chat_request(data)
        gen = await llm.prepare(kiln, admission, chat)
        gen.endpoint = "messages"
        if data.stream:
            chunks = completions.stream_chat(gen, StreamOptions(include_usage=True),
                                             reasoning=chat.include_reasoning)  # fmt: skip
            return completions.streamed(gen, messages.streamed(gen, chunks))
        body = await completions.complete_chat(gen, reasoning=chat.include_reasoning)
        return Response(messages.answered(gen, body), media_type=MediaType.JSON,
                        headers=lifecycle.headers(gen.version))  # fmt: skip

    @post("/count_tokens", status_code=200)
    async def count_tokens(
        self, kiln: KilnDep, admission: AdmissionDep, data: messages.MessagesRequest
    ) -> dict[str, int]:
        """The tokens the message's prompt takes (system, tools and history, as the model's
        chat template renders them); nothing is run or billed."""
        chat = messages.chat_request(data, generates=False)
        return {"input_tokens": await tokens.count_prompt(kiln, admission, chat)}
