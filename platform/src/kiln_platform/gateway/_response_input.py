"""A Responses request in the chat path's terms: the chat completion it is (``to_chat``), its
input items and function tools, and its 400s in its own names (``renamed``).

Message items become chat messages; ``function_call`` items (a previous response's calls, sent
back) become an assistant message's ``tool_calls`` (consecutive ones, one message), and
``function_call_output`` items ``tool`` messages; ``reasoning`` items (a reasoning model's,
sent back) are left out, as chat templates leave reasoning out. Function tools, flat here,
take chat's nested shape; other tool types (web search, file search…) are 400s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._prompts import ROLES
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, ContentPart, Message
from kiln_platform.gateway.responses_schemas import (
    LOGPROBS,
    NOTHING_TO_INCLUDE,
    UNSUPPORTED,
    InputItem,
    ResponsesRequest,
)

TEXT_PARTS = {"input_text", "output_text", "text"}
ITEMS = ("message", "function_call", "function_call_output", "reasoning")


def own(given: str | list[InputItem]) -> list[dict[str, Any]]:
    """A request's own input items, as JSON (a string is one user message)."""
    if isinstance(given, str):
        return [{"type": "message", "role": "user", "content": given}] if given else []
    return msgspec.to_builtins(given)  # type: ignore[no-any-return]


def _content(i: int, item: InputItem) -> str | list[ContentPart]:
    if isinstance(item.content, str):
        return item.content
    if item.content is None:
        raise BadRequest(f"'input[{i}].content' is required.", param=f"input[{i}].content")
    parts = []
    for j, part in enumerate(item.content):
        if part.type not in TEXT_PARTS or part.text is None:
            raise BadRequest(
                f"'input[{i}].content[{j}]' has type '{part.type}'; only text is supported.",
                param=f"input[{i}].content[{j}].type",
            )
        parts.append(ContentPart(type="text", text=part.text))
    return parts


def _required(i: int, item: InputItem, *fields: str) -> list[str]:
    values = []
    for name in fields:
        value = getattr(item, name)
        if not isinstance(value, str):
            where = f"input[{i}].{name}"
            raise BadRequest(f"'{where}' is required (a string).", param=where)
        values.append(value)
    return values


def _output(i: int, item: InputItem) -> str:
    """A ``function_call_output``'s text: a string, or its text parts joined."""
    if isinstance(item.output, str):
        return item.output
    parts: list[Any] = item.output if isinstance(item.output, list) else [None]
    if not all(isinstance(p, dict) and p.get("type") in TEXT_PARTS for p in parts):
        where = f"input[{i}].output"
        raise BadRequest(f"'{where}' must be a string or text parts.", param=where)
    return "".join(str(p.get("text", "")) for p in parts)


def _message(i: int, item: InputItem) -> Message:
    if item.role not in ROLES:
        raise BadRequest(
            f"'input[{i}].role' is '{item.role}'; Kiln supports system, developer, user and "
            "assistant.",
            param=f"input[{i}].role",
        )
    return Message(role=item.role, content=_content(i, item))


def messages(items: list[InputItem]) -> list[Message]:
    """The chat messages the input items are."""
    out: list[Message] = []
    for i, item in enumerate(items):
        if item.type not in ITEMS:
            raise BadRequest(
                f"'input[{i}]' has type '{item.type}'; Kiln serves {', '.join(ITEMS)} items.",
                param=f"input[{i}].type",
            )
        if item.type == "reasoning":
            continue
        if item.type == "message":
            out.append(_message(i, item))
        elif item.type == "function_call_output":
            (call_id,) = _required(i, item, "call_id")
            out.append(Message(role="tool", tool_call_id=call_id, content=_output(i, item)))
        else:
            call_id, name, arguments = _required(i, item, "call_id", "name", "arguments")
            call = {"id": call_id, "type": "function",
                    "function": {"name": name, "arguments": arguments}}  # fmt: skip
            last = out[-1] if out else None
            if last is not None and last.role == "assistant" and last.tool_calls:
                last.tool_calls.append(call)
            else:
                out.append(Message(role="assistant", tool_calls=[call]))
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Function tools in chat's shape (``{"type": "function", "function": {...}}``)."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list.", param="tools")
    nested = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise BadRequest(
                f"'tools[{i}]' has type {kind!r}; Kiln serves function tools only.",
                param=f"tools[{i}].type",
            )
        fields = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        nested.append({"type": "function", "function": fields})
    return nested


def chat_tool_choice(choice: Any) -> Any:
    """``{"type": "function", "name": …}`` in chat's nested shape; the strings as they are."""
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


# The chat path's names for the Responses API's fields, in its error messages.
_RENAMED = {
    "max_completion_tokens": "max_output_tokens", "messages": "input",
    "response_format.json_schema": "text.format", "response_format": "text.format",
    ".function": "", "reasoning_effort": "reasoning.effort",
}  # fmt: skip
_NAMES = re.compile(
    r"\b(max_completion_tokens|messages|response_format(?:\.json_schema)?|reasoning_effort)\b"
    r"|(?<=\])(\.function)\b"
)


def _reject_unsupported(request: ResponsesRequest) -> None:
    for field, unused in UNSUPPORTED.items():
        if getattr(request, field) not in unused:
            raise BadRequest(f"The parameter '{field}' is not supported by Kiln.", param=field)


def _logprobs_asked(request: ResponsesRequest) -> bool:
    """Whether ``include`` asks for the text's log-probabilities (400 naming it for a value
    it cannot take)."""
    for i, name in enumerate(request.include or []):
        if name != LOGPROBS and name not in NOTHING_TO_INCLUDE:
            raise BadRequest(f"'include[{i}]' cannot be {name!r}.", param=f"include[{i}]")
    return LOGPROBS in (request.include or []) or bool(request.top_logprobs)


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """``text.format`` as chat's ``response_format`` (a ``json_schema`` format is flat here)."""
    if text is None:
        return None
    if set(text) - {"format", "verbosity"} or text.get("verbosity") not in (None, "medium"):
        raise BadRequest(
            "'text' takes 'format' and 'verbosity' (medium only) in Kiln.", param="text"
        )
    given = text.get("format")
    if not isinstance(given, dict) or given.get("type") != "json_schema":
        return given
    return {"type": "json_schema", "json_schema": {"schema": given.get("schema", {})}}


def to_chat(
    request: ResponsesRequest, history: list[InputItem] | None = None
) -> ChatCompletionRequest:
    """The chat completion a response is: ``instructions`` as the first (system) message, the
    ``history`` it goes on from, then the input (a string is one user message)."""
    _reject_unsupported(request)
    if not request.input and not history:
        raise BadRequest("'input' must not be empty (it may be left out only when the "
                         "request goes on from a previous response or a conversation).",
                         param="input")  # fmt: skip
    given = request.input
    said = messages(history or []) + (
        ([Message(role="user", content=given)] if given else []) if isinstance(given, str)
        else messages(given)
    )  # fmt: skip
    if request.instructions:
        said.insert(0, Message(role="system", content=request.instructions))
    return ChatCompletionRequest(
        model=request.model, messages=said, max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature, top_p=request.top_p, stream=request.stream,
        user=request.user or request.safety_identifier,
        response_format=_response_format(request.text),
        tools=chat_tools(request.tools),
        tool_choice=chat_tool_choice(request.tool_choice),
        parallel_tool_calls=request.parallel_tool_calls,
        logprobs=_logprobs_asked(request) or None, top_logprobs=request.top_logprobs,
        service_tier=request.service_tier,
        reasoning_effort=request.reasoning.effort if request.reasoning else None,
    )  # fmt: skip


@contextmanager
def renamed() -> Iterator[None]:
    """A 400 of the chat path inside, its message and param in the Responses API's names."""
    try:
        yield
    except BadRequest as exc:
        message = _NAMES.sub(lambda m: _RENAMED[m.group(0)], exc.message)
        param = exc.param and _NAMES.sub(lambda m: _RENAMED[m.group(0)], exc.param)
        raise BadRequest(message, param=param) from exc
