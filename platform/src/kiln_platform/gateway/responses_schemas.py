"""OpenAI Responses API shapes (msgspec): text in, one assistant message out (after a
reasoning model's reasoning item).

As with chat completions, parameters Kiln knows but does not serve are declared so that a
request using them gets a 400 naming them (``UNSUPPORTED``); anything unknown is rejected by
``forbid_unknown_fields``. A response is kept only when asked (``store: true``,
``response_store``); a later request goes on from it with ``previous_response_id``, or sends
the history as input items, as a stateless Responses client does.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from kiln_platform.gateway.llm_schemas import PromptCacheOptions


class InputPart(msgspec.Struct, kw_only=True):
    """One part of an input message's content: ``input_text`` (or ``output_text`` in an
    assistant message sent back as history)."""

    type: str
    text: str | None = None


class InputItem(msgspec.Struct, kw_only=True):
    """One input item: a message (``type: message``, the default), a function call sent back
    (``function_call``: ``call_id``, ``name``, ``arguments``) or its result
    (``function_call_output``: ``call_id``, ``output``), or a reasoning item sent back
    (``reasoning``: kept, not shown to the model, as chat templates leave reasoning out). Other
    fields an item carries (``id``, ``status``) are ignored."""

    type: str = "message"
    role: str | None = None
    content: str | list[InputPart] | None = None
    call_id: Any = None
    name: Any = None
    arguments: Any = None
    output: Any = None
    summary: Any = None


class Reasoning(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``reasoning``: ``effort`` is the chat template's ``reasoning_effort`` (as chat's); Kiln
    writes no summaries (a reasoning item's ``summary`` is empty, its text in ``content``), so
    ``summary`` is taken and unused."""

    effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class ResponsesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/responses``."""

    model: str
    input: str | list[InputItem] = ""
    """Absent or empty only when the request goes on from a history (``previous_response_id``,
    ``conversation``): the model answers after it."""
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    """A routing hint for OpenAI's cache; Kiln's prefix cache needs none (accepted, unused;
    likewise the two below)."""
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    parallel_tool_calls: bool | None = None
    store: bool | None = None
    """Keep the response (``responses_ttl_days``) for ``GET`` and ``previous_response_id``;
    absent is false (OpenAI's default is true: Kiln keeps nothing unasked)."""
    previous_response_id: str | None = None
    conversation: Any = None
    tools: Any = None
    tool_choice: Any = None
    max_tool_calls: Any = None
    reasoning: Reasoning | None = None
    text: dict[str, Any] | None = None
    """``format`` (``text``, ``json_object`` or ``json_schema``: structured output, as chat's
    ``response_format``) and ``verbosity`` (``medium`` only)."""
    include: list[str] | None = None
    """``message.output_text.logprobs`` adds the text's log-probabilities; what names items
    Kiln never makes (web search results, reasoning, images...) is taken: there is nothing
    to include."""
    truncation: Any = None
    """``auto``: a conversation too long for the context loses its oldest turns
    (``responses._fitted``); ``disabled`` (the default): it is a 400."""
    top_logprobs: int | None = None
    """How many alternatives each token's log-probability carries (0-20)."""
    background: bool | None = None
    """Run after the response is sent (``queued``, stored): ``GET`` it for its end, or
    ``POST .../cancel`` (``gateway.background``)."""
    prompt: Any = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    """``flex``: the ``batch`` class, priced as a batch line (``Admission.serve_as``)."""


LOGPROBS = "message.output_text.logprobs"
NOTHING_TO_INCLUDE = frozenset({
    "code_interpreter_call.outputs", "computer_call_output.output.image_url",
    "file_search_call.results", "message.input_image.image_url", "reasoning.encrypted_content",
    "web_search_call.action.sources", "web_search_call.results",
})  # fmt: skip
"""``include`` values naming items Kiln's answers never have (hosted tools, reasoning, images)."""


class InputTokensRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/responses/input_tokens``: what a response would be made of, to count."""

    model: str
    input: str | list[InputItem] = ""
    """Absent or empty only when the request goes on from a history (``previous_response_id``,
    ``conversation``): the model answers after it."""
    instructions: str | None = None
    tools: Any = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    conversation: Any = None
    text: dict[str, Any] | None = None
    reasoning: Reasoning | None = None
    truncation: str | None = None

    def as_response(self) -> ResponsesRequest:
        """The response request these fields are."""
        return ResponsesRequest(**msgspec.structs.asdict(self))


# field -> the value(s) that mean "not used"
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "truncation": (None, "disabled", "auto"),
    "prompt": (None,),
}


class OutputText(msgspec.Struct, kw_only=True, omit_defaults=False):
    """The message's text."""

    text: str
    type: str = "output_text"
    annotations: list[Any] = []
    logprobs: list[Any] = []


class OutputMessage(msgspec.Struct, kw_only=True, omit_defaults=False, tag="message",
                    tag_field="type"):  # fmt: skip
    """The generated assistant message (the output item of a text answer)."""

    id: str
    status: str
    content: list[OutputText]
    role: str = "assistant"


class FunctionCallItem(msgspec.Struct, kw_only=True, omit_defaults=False, tag="function_call",
                       tag_field="type"):  # fmt: skip
    """One call of a function tool (the output items of a tool-call answer)."""

    id: str
    call_id: str
    name: str
    arguments: str
    status: str = "completed"


class ReasoningText(msgspec.Struct, kw_only=True):
    """A reasoning item's text."""

    text: str
    type: str = "reasoning_text"


class ReasoningItem(msgspec.Struct, kw_only=True, omit_defaults=False, tag="reasoning",
                    tag_field="type"):  # fmt: skip
    """What a reasoning model wrote between its ``<think>`` tags (``gateway._reasoning``),
    before its message."""

    id: str
    content: list[ReasoningText]
    summary: list[Any] = []
    status: str = "completed"


class InputTokensDetails(msgspec.Struct, kw_only=True):
    """Of the input tokens, those whose KV the worker's prefix cache held (billed alike)."""

    cached_tokens: int = 0


class OutputTokensDetails(msgspec.Struct, kw_only=True):
    """Of the output tokens, a reasoning model's reasoning (its tags included)."""

    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, kw_only=True):
    """Token counts."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens_details: OutputTokensDetails = msgspec.field(default_factory=OutputTokensDetails)


class IncompleteDetails(msgspec.Struct, kw_only=True):
    """Why the response stopped short: ``max_output_tokens`` (the limit, or the server's
    deadline)."""

    reason: str


class ResponseError(msgspec.Struct, kw_only=True):
    """Why a streamed response failed after it started."""

    code: str
    message: str


class ResponseObject(msgspec.Struct, kw_only=True, omit_defaults=False):
    """``response``: its ``status`` is ``completed``, ``incomplete`` (see
    ``incomplete_details``), ``failed`` (a stream's last event) or ``in_progress`` (a stream's
    first events); a background one's also ``queued`` and ``cancelled``."""

    id: str
    created_at: int
    model: str
    status: str
    output: list[ReasoningItem | OutputMessage | FunctionCallItem]
    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    completed_at: int | None = None
    system_fingerprint: str | None = None
    """``kiln-<version>-<build digest>``: which version answered (a Kiln extension)."""
    service_tier: str | None = None
    """``default`` or ``flex``: the tier that served it."""
    object: str = "response"
    store: bool = False
    background: bool = False
    previous_response_id: str | None = None
    conversation: dict[str, str] | None = None
    """``{"id": <conversation>}`` when the request named one."""
    parallel_tool_calls: bool = True
    tool_choice: Any = "auto"
    tools: list[Any] = []
    truncation: str = "disabled"
    reasoning: Reasoning | None = None
    text: dict[str, Any] = msgspec.field(default_factory=lambda: {"format": {"type": "text"}})
