"""OpenAI-compatible chat and text completion shapes (msgspec).

Parameters Kiln knows but does not support are declared so that a request using them is
rejected with a 400 naming them (``UNSUPPORTED``), never silently ignored; anything unknown is
rejected by ``forbid_unknown_fields``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content; only ``text`` parts are supported."""

    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    """A chat message."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class StreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``stream_options``."""

    include_usage: bool = False


class _Sampling(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Parameters shared by chat and text completions."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    n: int | None = None
    logprobs: Any = None
    top_logprobs: Any = None
    logit_bias: Any = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    service_tier: Any = None
    store: Any = None
    metadata: Any = None


class ChatCompletionRequest(_Sampling, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/chat/completions``."""

    messages: list[Message]
    max_completion_tokens: int | None = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    web_search_options: Any = None


class CompletionRequest(_Sampling, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/completions``."""

    prompt: str | list[Any]
    echo: Any = None
    suffix: Any = None
    best_of: Any = None


# field -> the value(s) that mean "not used"
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (None, 1),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "service_tier": (None, "auto", "default"),
    "store": (None, False),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None,),
    "response_format": (None, {"type": "text"}),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "echo": (None, False),
    "suffix": (None, ""),
    "best_of": (None, 1),
}


class Usage(msgspec.Struct, kw_only=True):
    """Token counts."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(msgspec.Struct, kw_only=True, omit_defaults=False):
    """The generated message."""

    content: str
    role: str = "assistant"
    refusal: None = None


class ChatChoice(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A chat completion choice."""

    message: AssistantMessage
    finish_reason: str
    index: int = 0
    logprobs: None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    """``chat.completion``."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    """``kiln-<version>-<build digest>``: which version answered."""
    object: str = "chat.completion"


class Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The change a chunk carries."""

    role: str | None = None
    content: str | None = None


class ChunkChoice(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A streamed chat choice."""

    delta: Delta
    finish_reason: str | None = None
    index: int = 0
    logprobs: None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True, omit_defaults=False):
    """``chat.completion.chunk``."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    """``kiln-<version>-<build digest>``: which version answered."""
    object: str = "chat.completion.chunk"


class TextChoice(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A text completion choice (also used in its stream chunks)."""

    text: str
    finish_reason: str | None
    index: int = 0
    logprobs: None = None


class TextCompletion(msgspec.Struct, kw_only=True, omit_defaults=False):
    """``text_completion`` (a response, or one stream chunk)."""

    id: str
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    """``kiln-<version>-<build digest>``: which version answered."""
    object: Literal["text_completion"] = "text_completion"
