"""OpenAI-compatible chat and text completion shapes (msgspec).

Parameters Kiln knows but does not support are declared so that a request using them is
rejected with a 400 naming them (``UNSUPPORTED``), never silently ignored; anything unknown is
rejected by ``forbid_unknown_fields``.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from kiln_platform.errors import BadRequest


class ContentPart(msgspec.Struct, kw_only=True):
    """One part of a message's content; only ``text`` parts are supported."""

    type: str
    text: str | None = None


class Message(msgspec.Struct, kw_only=True):
    """A chat message."""

    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """An assistant message's calls (OpenAI's shape), sent back as history."""
    tool_call_id: str | None = None
    """A ``tool`` message's answer to that call."""


class StreamOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``stream_options``."""

    include_usage: bool = False
    continuous_usage_stats: bool | None = None
    """vLLM's: with ``include_usage``, every chunk carries the usage so far too."""
    include_obfuscation: bool | None = None
    """OpenAI's random padding of each delta against size side channels: accepted, and Kiln
    sends none either way (false, the value clients set to save bandwidth, is what it does)."""


class PromptCacheOptions(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's ``prompt_cache_options``: accepted, unused (Kiln's prefix cache is automatic,
    shared within a tenant, kept while its memory bound allows)."""

    mode: Literal["implicit", "explicit"] = "implicit"
    ttl: str | None = None


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
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    """vLLM's extra parameter: sample among the ``top_k`` most probable tokens (-1 or 0: all)."""
    min_p: float | None = None
    """vLLM's: drop tokens less probable than ``min_p`` times the most probable one."""
    repetition_penalty: float | None = None
    """vLLM's: divide the logits of prompt and output tokens by it (1: off)."""
    ignore_eos: bool | None = None
    """vLLM's: the model's end-of-sequence tokens do not end the answer; ``max_tokens`` does
    (benchmarks use it for answers of a fixed length)."""
    min_tokens: int | None = None
    """vLLM's: no end-of-sequence or ``stop_token_ids`` token before this many are generated."""
    stop_token_ids: list[int] | None = None
    """vLLM's: more token ids that end the answer (not part of it)."""
    include_stop_str_in_output: bool | None = None
    """vLLM's: the ``stop`` string that ended the answer is kept at its end."""
    skip_special_tokens: bool | None = None
    """vLLM's: special tokens are left out of the text (the default); false writes them."""
    structured_outputs: dict[str, Any] | None = None
    """vLLM's structured outputs: one of ``json`` (a schema), ``regex``, ``choice`` (strings),
    ``grammar`` (Lark) or ``json_object: true`` (``gateway/_structured.py``)."""
    guided_json: Any = None
    """vLLM's older spelling of ``structured_outputs.json`` (likewise the three below)."""
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    """``flex``: the ``batch`` class, priced as a batch line (``Admission.serve_as``)."""
    prompt_logprobs: int | None = None
    """vLLM's: each prompt token's log-probability, rank and this many alternatives (a text
    choice's ``prompt_logprobs``, a chat completion's); not with ``stream``."""
    truncate_prompt_tokens: int | None = None
    """vLLM's: the prompt (a chat's as templated) keeps its last this many tokens (-1: as many
    as the model's context holds), cut before the limits are checked."""
    metadata: Any = None


class ChatCompletionRequest(_Sampling, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/chat/completions``."""

    messages: list[Message]
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    function_call: Any = None
    parallel_tool_calls: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """The chat template's ``reasoning_effort`` variable (as vLLM gives it; gpt-oss's template
    reads it); taken by a model whose template reads it or that reasons in tags, else a 400."""
    web_search_options: Any = None
    verbosity: Any = None
    prompt_cache_key: str | None = None
    """OpenAI's cache-routing hint: accepted and unused (the prefix cache is automatic and
    shared within a tenant only); likewise the two below."""
    prompt_cache_options: PromptCacheOptions | None = None
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    safety_identifier: str | None = None
    """OpenAI's end-user id for abuse detection (``user``'s successor): accepted, unused."""
    chat_template_kwargs: dict[str, Any] | None = None
    """vLLM's: more variables for the model's chat template (``enable_thinking: false`` for a
    model whose template reads it); a template that does not read one ignores it."""
    include_reasoning: bool = True
    """vLLM's: a reasoning model's ``reasoning`` is sent (false: left out, content alone)."""
    thinking_token_budget: int | None = None
    """vLLM's: a reasoning model's reasoning is closed once it has written so many tokens."""
    add_generation_prompt: bool | None = None
    """vLLM's: end the prompt with the assistant's turn (the default); false leaves it out."""
    continue_final_message: bool | None = None
    """vLLM's: the model goes on with the last message (an assistant's answer begun by the
    caller) instead of answering after it; the completion is what it adds."""
    keep: bool | None = msgspec.field(default=None, name="store")
    """``store``: keep the completion (``gateway.chat_kept``). Named apart so that
    ``UNSUPPORTED`` (read by attribute) still refuses the legacy completions' ``store``."""


class CompletionRequest(_Sampling, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/completions``."""

    prompt: str | list[Any]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: Any = None
    best_of: Any = None
    store: Any = None


# field -> the value(s) that mean "not used"
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "store": (None, False),
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "verbosity": (None, "medium"),
    "web_search_options": (None,),
    "suffix": (None, ""),
    "best_of": (None, 1),
}


def supported(request: ChatCompletionRequest | CompletionRequest) -> None:
    """A 400 naming the first parameter of ``UNSUPPORTED`` the request uses."""
    for field, unused in UNSUPPORTED.items():
        if getattr(request, field, None) not in unused:
            raise BadRequest(f"The parameter '{field}' is not supported by Kiln.", param=field)


class PromptTokensDetails(msgspec.Struct, kw_only=True):
    """Of the prompt tokens, those whose KV the worker's prefix cache held (billed alike)."""

    cached_tokens: int = 0


class CompletionTokensDetails(msgspec.Struct, kw_only=True):
    """Of a chat's completion tokens, those of a reasoning model's reasoning (``_reasoning``;
    0 for any other model, as OpenAI's)."""

    reasoning_tokens: int = 0


class Usage(msgspec.Struct, kw_only=True):
    """Token counts."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = msgspec.field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails | msgspec.UnsetType = msgspec.UNSET
    """A chat's (left out of a text completion's)."""


class FunctionCall(msgspec.Struct, kw_only=True):
    """A function and its arguments (a JSON text)."""

    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    """One call of a tool the request offered."""

    id: str
    function: FunctionCall
    type: str = "function"


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A streamed tool call (Kiln sends each whole, in one chunk)."""

    index: int
    id: str
    function: FunctionCall
    type: str = "function"


class AssistantMessage(msgspec.Struct, kw_only=True, omit_defaults=False):
    """The generated message: text, or (with ``tools``) calls and no text."""

    content: str | None
    role: str = "assistant"
    refusal: None = None
    tool_calls: list[ToolCall] | None = None
    reasoning: str | msgspec.UnsetType = msgspec.UNSET
    """A reasoning model's reasoning (vLLM's field; left out when there is none)."""
    reasoning_content: str | msgspec.UnsetType = msgspec.UNSET
    """The same under DeepSeek's name, which vLLM used before and many clients read."""

    @classmethod
    def reasoned(
        cls, content: str | None, reasoning: str, *, shown: bool = True,
        tool_calls: list[ToolCall] | None = None,
    ) -> AssistantMessage:  # fmt: skip
        """A reasoning model's answer: its content (``None`` if it wrote only reasoning) or its
        calls, and its reasoning under both names (left out if none, or not ``shown``)."""
        said = reasoning if reasoning and shown else msgspec.UNSET
        return cls(content=content or (None if reasoning else content), reasoning=said,
                   reasoning_content=said, tool_calls=tool_calls)  # fmt: skip


class TopLogprob(msgspec.Struct, kw_only=True, omit_defaults=False):
    """An alternative token and its log-probability."""

    token: str
    logprob: float
    bytes_: list[int] | None = msgspec.field(default=None, name="bytes")


class TokenLogprob(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A generated token, its log-probability and the most probable alternatives."""

    token: str
    logprob: float
    bytes_: list[int] | None = msgspec.field(default=None, name="bytes")
    top_logprobs: list[TopLogprob] = []


class ChoiceLogprobs(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A chat choice's ``logprobs``."""

    content: list[TokenLogprob] | None
    refusal: None = None


class TextLogprobs(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A text choice's ``logprobs`` (the legacy completions shape)."""

    tokens: list[str]
    token_logprobs: list[float | None]
    """``None`` for an echoed prompt's first token (as OpenAI)."""
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class ChatChoice(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A chat completion choice."""

    message: AssistantMessage
    finish_reason: str
    index: int = 0
    logprobs: ChoiceLogprobs | None = None
    stop_reason: str | int | None = None
    """vLLM's: the stop string or ``stop_token_ids`` entry that ended it (``None``: EOS)."""


class ChatCompletion(msgspec.Struct, kw_only=True):
    """``chat.completion``."""

    id: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None
    """``kiln-<version>-<build digest>``: which version answered."""
    service_tier: str | None = None
    """``default`` or ``flex``: the tier that served it."""
    prompt_logprobs: PromptLogprobs | msgspec.UnsetType = msgspec.UNSET
    object: str = "chat.completion"


class Delta(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The change a chunk carries."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    """``reasoning`` under DeepSeek's name too (``AssistantMessage.reasoning_content``)."""
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A streamed chat choice."""

    delta: Delta
    finish_reason: str | None = None
    index: int = 0
    logprobs: ChoiceLogprobs | None = None
    stop_reason: str | int | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True, omit_defaults=False):
    """``chat.completion.chunk``."""

    id: str
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    system_fingerprint: str | None = None
    """``kiln-<version>-<build digest>``: which version answered."""
    service_tier: str | None = None
    object: str = "chat.completion.chunk"


class PromptLogprob(msgspec.Struct, kw_only=True):
    """One token at a scored prompt position (vLLM's ``prompt_logprobs`` entries)."""

    logprob: float
    rank: int
    decoded_token: str


PromptLogprobs = list[dict[str, PromptLogprob] | None]
"""Per prompt token, by token id: itself and its alternatives (``None`` for the first)."""


class TextChoice(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A text completion choice (also used in its stream chunks)."""

    text: str
    finish_reason: str | None
    index: int = 0
    logprobs: TextLogprobs | None = None
    prompt_logprobs: PromptLogprobs | msgspec.UnsetType = msgspec.UNSET
    stop_reason: str | int | None = None


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
