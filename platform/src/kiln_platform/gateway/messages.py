"""Anthropic's Messages API (``POST /v1/messages``, ``…/count_tokens``), what the official
``anthropic`` SDK and the tools built on it call (vLLM and LiteLLM serve it too): a chat
completion underneath (``llm.prepare``; billed under ``messages``), its request and answer
translated.

The request: ``system`` (text or text blocks), ``messages`` whose content is text or blocks —
``text``, an assistant's ``tool_use`` (a call), a user's ``tool_result`` (a ``tool`` message),
an assistant's ``thinking`` (left out, as a chat's reasoning sent back is) — ``max_tokens``,
``stop_sequences``, ``temperature``, ``top_p``, ``top_k``, ``tools`` (``input_schema``: the
function's parameters), ``tool_choice`` (``auto``, ``any``: required, ``tool``: named,
``none``; ``disable_parallel_tool_use``), ``metadata.user_id``, ``thinking``
(``disabled`` leaves a reasoning model's reasoning out; ``budget_tokens`` closes it once spent).
A block or tool Kiln cannot run (images, documents, server tools) is a 400 naming it.

The answer: a ``message`` whose content is a reasoning model's ``thinking`` block (its
``signature`` empty: nothing is signed), the ``text`` and the ``tool_use`` blocks;
``stop_reason`` ``end_turn``, ``stop_sequence`` (with the one met), ``max_tokens`` or
``tool_use``; ``usage`` with the prompt's cached tokens as ``cache_read_input_tokens`` (not in
``input_tokens``, as Anthropic counts them). Streamed: ``message_start``, each block's
``content_block_start``, deltas (``thinking_delta``, ``text_delta``, ``input_json_delta``: a
call's arguments whole) and ``content_block_stop``, then ``message_delta`` (the stop reason,
the output tokens) and ``message_stop``; a failure after the start is an ``error`` event.
"""

from __future__ import annotations

import contextlib
import json
from typing import TYPE_CHECKING, Any

import msgspec

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._prompts import MAX_STOP
from kiln_platform.gateway.completions import DONE
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from kiln_platform.gateway.llm import Generation
    from kiln_platform.gateway.llm_schemas import ChatCompletion

STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
"""A chat's finish reason as Anthropic's stop reason."""
CHOICES = {"auto": "auto", "any": "required", "none": "none"}
ERRORS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
          503: "overloaded_error", 529: "overloaded_error"}  # fmt: skip
"""Anthropic's error type of each status (others: ``api_error``)."""


class MessagesRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/messages`` (``count_tokens`` takes the same, less what only generates)."""

    model: str
    messages: list[dict[str, Any]]
    max_tokens: int | None = None
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    service_tier: str | None = None
    cache_control: Any = None
    """Accepted, as on blocks, and not needed: the prefix cache reuses earlier prompts' blocks."""


def error_body(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object."""
    return {"type": "error", "error": {"type": ERRORS.get(status, "api_error"), "message": message}}


def _text(value: Any, where: str) -> str:
    """Text, or text blocks joined."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, dict) for b in value):
        for j, block in enumerate(value):
            if block.get("type") != "text" or not isinstance(block.get("text"), str):
                raise BadRequest(f"'{where}[{j}]' must be a text block.", param=f"{where}[{j}]")
        return "".join(block["text"] for block in value)
    raise BadRequest(f"'{where}' must be text or a list of text blocks.", param=where)


def _message(i: int, message: dict[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (a user's tool results first, as ``tool`` ones)."""
    role, content, where = message.get("role"), message.get("content"), f"messages[{i}]"
    if role not in ("user", "assistant"):
        raise BadRequest(f"'{where}.role' must be 'user' or 'assistant'.", param=f"{where}.role")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise BadRequest(f"'{where}.content' must be text or a list of content blocks.",
                         param=f"{where}.content")  # fmt: skip
    made, texts, calls = [], [], []
    for j, block in enumerate(content):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise BadRequest(f"'{at}.text' must be text.", param=f"{at}.text")
            texts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input", {}))
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "tool_result" and role == "user":
            said = _text(block.get("content", ""), f"{at}.content")
            made.append({"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": said})
        elif kind in ("thinking", "redacted_thinking") and role == "assistant":
            continue  # a reasoning model's reasoning, not shown to it again
        else:
            raise BadRequest(f"'{at}.type' {kind!r} is not a block Kiln takes in a {role}'s "
                             "message (text; tool_use from the assistant, tool_result from the "
                             "user; thinking).", param=f"{at}.type")  # fmt: skip
    if calls:
        made.append({"role": role, "content": texts or None, "tool_calls": calls})
    elif texts or not made:
        made.append({"role": role, "content": texts})
    return made


def _tools(data: MessagesRequest) -> dict[str, Any]:
    """The chat's ``tools``, ``tool_choice`` and ``parallel_tool_calls``."""
    fields: dict[str, Any] = {}
    if data.tool_choice is not None or data.tools is not None:
        fields |= _choice(data.tool_choice or {"type": "auto"})
    if data.tools is None:
        return fields
    tools = []
    for i, tool in enumerate(data.tools):
        if tool.get("type") not in (None, "custom"):
            raise BadRequest(f"'tools[{i}].type' {tool.get('type')!r}: Kiln runs no server "
                             "tools; give custom tools (name, input_schema).",
                             param=f"tools[{i}].type")  # fmt: skip
        spec = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
        if tool.get("description") is not None:
            spec["description"] = tool["description"]
        tools.append({"type": "function", "function": spec})
    return {**fields, "tools": tools}


def _choice(choice: dict[str, Any]) -> dict[str, Any]:
    """The chat's ``tool_choice`` and ``parallel_tool_calls`` of Anthropic's ``tool_choice``."""
    fields: dict[str, Any] = {}
    kind = choice.get("type")
    if kind == "tool":
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in CHOICES:
        fields["tool_choice"] = CHOICES[kind]
    else:
        raise BadRequest("'tool_choice.type' must be auto, any, tool or none.",
                         param="tool_choice.type")  # fmt: skip
    if choice.get("disable_parallel_tool_use"):
        fields["parallel_tool_calls"] = False
    return fields


def _output(config: dict[str, Any]) -> dict[str, Any]:
    """``output_config``: ``format`` (a JSON schema: the chat's ``response_format``) and
    ``effort`` (the chat's ``reasoning_effort``; ``max`` its ``xhigh``)."""
    fields: dict[str, Any] = {}
    if (effort := config.get("effort")) is not None:
        fields["reasoning_effort"] = "xhigh" if effort == "max" else effort
    if (form := config.get("format")) is not None:
        if not isinstance(form, dict) or form.get("type") != "json_schema":
            raise BadRequest("'output_config.format.type' must be 'json_schema'.",
                             param="output_config.format.type")  # fmt: skip
        schema = {"name": "output", "schema": form.get("schema", {})}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    return fields


def chat_request(data: MessagesRequest, *, generates: bool = True) -> ChatCompletionRequest:
    """The chat completion a Messages request is (``generates``: ``max_tokens`` needed)."""
    if generates and data.max_tokens is None:
        raise BadRequest("'max_tokens' is required.", param="max_tokens")
    if len(data.stop_sequences or ()) > MAX_STOP:
        raise BadRequest(f"'stop_sequences' takes up to {MAX_STOP} sequences.",
                         param="stop_sequences")  # fmt: skip
    messages = [] if data.system is None else [
        {"role": "system", "content": _text(data.system, "system")}]  # fmt: skip
    for i, message in enumerate(data.messages):
        messages += _message(i, message)
    thinking = (data.thinking or {}).get("type")
    body = {
        "model": data.model, "messages": messages, "max_tokens": data.max_tokens,
        "stop": data.stop_sequences, "temperature": data.temperature, "top_p": data.top_p,
        "top_k": data.top_k, "stream": data.stream and generates,
        "user": (data.metadata or {}).get("user_id"), "include_reasoning": thinking != "disabled",
        "thinking_token_budget": (data.thinking or {}).get("budget_tokens")
        if thinking == "enabled" else None,
        **_tools(data), **_output(data.output_config or {}),
    }  # fmt: skip
    try:
        return msgspec.convert({k: v for k, v in body.items() if v is not None},
                               ChatCompletionRequest)  # fmt: skip
    except msgspec.ValidationError as exc:
        raise BadRequest(f"Invalid messages request: {exc}") from None


def message_id(gen: Generation) -> str:
    """``msg_<request id>``, as Anthropic's ids are written."""
    return f"msg_{gen.request.request_id.removeprefix('req_')}"


def _usage(prompt: int, cached: int, output: int) -> dict[str, int]:
    return {"input_tokens": prompt - cached, "output_tokens": output,
            "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}  # fmt: skip


def answered(gen: Generation, chat: ChatCompletion) -> dict[str, Any]:
    """The Messages answer of a finished chat completion."""
    choice, usage = chat.choices[0], chat.usage
    message, content = choice.message, list[dict[str, Any]]()
    if isinstance(message.reasoning, str) and message.reasoning:
        content.append({"type": "thinking", "thinking": message.reasoning, "signature": ""})
    if message.content:
        content.append({"type": "text", "text": message.content})
    for call in message.tool_calls or []:
        content.append({"type": "tool_use", "id": call.id, "name": call.function.name,
                        "input": json.loads(call.function.arguments)})  # fmt: skip
    stop, sequence = _stop(choice.finish_reason, choice.stop_reason)
    return {
        "id": message_id(gen), "type": "message", "role": "assistant", "model": gen.name,
        "content": content, "stop_reason": stop, "stop_sequence": sequence,
        "usage": _usage(usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens,
                        usage.completion_tokens),
    }  # fmt: skip


def _stop(finish: str | None, met: str | int | None) -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a chat's finish and the stop
    string it met (vLLM's ``stop_reason``)."""
    if finish == "stop" and isinstance(met, str):
        return "stop_sequence", met
    return STOP.get(finish or "", "end_turn"), None


def _event(kind: str, **fields: Any) -> bytes:
    body = msgspec.json.encode({"type": kind, **fields})
    return b"event: " + kind.encode() + b"\ndata: " + body + b"\n\n"


async def streamed(
    gen: Generation, chunks: AsyncGenerator[bytes, None]
) -> AsyncGenerator[bytes, None]:
    """Anthropic's stream of events from a chat completion's chunks (``stream_chat`` with the
    usage asked)."""
    start: dict[str, Any] = {
        "id": message_id(gen), "type": "message", "role": "assistant", "model": gen.name,
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": _usage(gen.prompt_tokens, 0, 0),
    }  # fmt: skip
    yield _event("message_start", message=start)
    blocks = _Blocks()
    stop, sequence, output = "end_turn", None, 0
    async with contextlib.aclosing(chunks):  # closed with this stream (a client gone)
        async for raw in chunks:
            if raw == DONE:
                break
            payload = json.loads(raw[6:])
            if "error" in payload:
                yield _event("error", **error_body(500, payload["error"]["message"]))
                return
            if payload.get("usage") and not payload["choices"]:
                output = payload["usage"]["completion_tokens"]
            for choice in payload["choices"]:
                for event in blocks.delta(choice["delta"]):
                    yield event
                if choice.get("finish_reason"):
                    stop, sequence = _stop(choice["finish_reason"], choice.get("stop_reason"))
    for event in blocks.close():
        yield event
    yield _event("message_delta", delta={"stop_reason": stop, "stop_sequence": sequence},
                 usage={"output_tokens": output})  # fmt: skip
    yield _event("message_stop")


class _Blocks:
    """The stream's content blocks: the one open (its kind), and how many there were."""

    def __init__(self) -> None:
        self.open: str | None = None
        self.count = 0

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", index=self.count - 1)]

    def start(self, block: dict[str, Any]) -> list[bytes]:
        events = self.close()
        self.open, self.count = block["type"], self.count + 1
        return [*events, _event("content_block_start", index=self.count - 1, content_block=block)]

    def delta(self, delta: dict[str, Any]) -> list[bytes]:
        """The events of one chunk's delta: its reasoning, its text, its calls (each whole)."""
        events: list[bytes] = []
        for kind, field, block in (("thinking", "reasoning", {"thinking": "", "signature": ""}),
                                   ("text", "content", {"text": ""})):  # fmt: skip
            if said := delta.get(field):
                if self.open != kind:
                    events += self.start({"type": kind, **block})
                typed = {"type": f"{kind}_delta", kind: said}
                events.append(_event("content_block_delta", index=self.count - 1, delta=typed))
        for call in delta.get("tool_calls") or []:
            events += self.start({"type": "tool_use", "id": call["id"],
                                  "name": call["function"]["name"], "input": {}})  # fmt: skip
            typed = {"type": "input_json_delta", "partial_json": call["function"]["arguments"]}
            events += [_event("content_block_delta", index=self.count - 1, delta=typed),
                       *self.close()]  # fmt: skip
        return events
