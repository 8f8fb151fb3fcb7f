"""A chat or text completion's prompts, stop strings and token limit, validated."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import _tools
from kiln_platform.gateway._offload import off_loop
from kiln_platform.gateway._textstream import Detokenizing
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest, Message
from kiln_platform.gateway.services import kept
from kiln_runtimes import tracing

if TYPE_CHECKING:
    from kiln_platform.gateway._textmodel import TextModel
    from kiln_platform.gateway._tools import ToolPlan

ROLES = {"system", "developer", "user", "assistant"}
CHAT_ROLES = ROLES | {"tool"}
MAX_STOP = 4
MAX_PROMPTS = 16
"""Prompts one text completion may carry (each is generated as its own sequences)."""


def _message_text(i: int, message: Message) -> str:
    if message.role not in CHAT_ROLES:
        raise BadRequest(
            f"'messages[{i}].role' is '{message.role}'; Kiln supports system, developer, user, "
            "assistant and tool.",
            param=f"messages[{i}].role",
        )
    if isinstance(message.content, str):
        return message.content
    if message.content is None and message.tool_calls:
        return ""
    if message.content is None:
        raise BadRequest(f"'messages[{i}].content' is required.", param=f"messages[{i}].content")
    parts = []
    for j, part in enumerate(message.content):
        if part.type != "text" or part.text is None:
            raise BadRequest(
                f"'messages[{i}].content[{j}]' has type '{part.type}'; only text is supported.",
                param=f"messages[{i}].content[{j}].type",
            )
        parts.append(part.text)
    return "".join(parts)


def _turn(i: int, message: Message, model: TextModel) -> dict[str, Any]:
    """One message as the template takes it: an assistant's calls in Hugging Face's shape
    (arguments parsed), or, for a template that does not render calls, as Hermes
    ``<tool_call>`` blocks after its text (the format ``tool_choice: "auto"`` writes)."""
    role = "system" if message.role == "developer" else message.role
    turn: dict[str, Any] = {"role": role, "content": _message_text(i, message)}
    if message.tool_call_id is not None:
        turn["tool_call_id"] = _call_id(message.tool_call_id, model)
    if message.tool_calls:
        calls = _calls(i, message.tool_calls)
        if model.tool_aware:
            turn["tool_calls"] = [
                {"type": "function", "id": _call_id(given.get("id"), model), "function": c}
                for given, c in zip(message.tool_calls, calls, strict=True)
            ]  # fmt: skip
        else:
            said = [f"<tool_call>\n{json.dumps(c)}\n</tool_call>" for c in calls]
            turn["content"] = "\n".join([turn["content"], *said]).strip()
    return turn


def _call_id(given: Any, model: TextModel) -> Any:
    """A call's id as the template takes it: nine letters and digits made from it (the same
    for the same id) for a template that refuses any other (Mistral's)."""
    if not model.nine_ids or not isinstance(given, str):
        return given
    return hashlib.sha256(given.encode()).hexdigest()[:9]


def _calls(i: int, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages[i].tool_calls`` as name and parsed arguments."""
    parsed = []
    for j, call in enumerate(calls):
        function: Any = call.get("function")
        try:
            name, arguments = function["name"], json.loads(function.get("arguments") or "{}")
        except (TypeError, KeyError, ValueError, AttributeError):
            raise BadRequest(
                f"'messages[{i}].tool_calls[{j}].function' must have a 'name' and JSON "
                "'arguments'.",
                param=f"messages[{i}].tool_calls[{j}].function",
            ) from None
        parsed.append({"name": name, "arguments": arguments})
    return parsed


def chat_prompt(
    request: ChatCompletionRequest, model: TextModel, plan: ToolPlan | None = None
) -> list[int]:
    """Validate the messages, render the model's chat template (its ``tool_use`` one if the
    request offers ``tools`` and the model has one), tokenize; when the model may choose to
    call them and its template does not show them, a system message does (``_tools.brief``)."""
    if not request.messages:
        raise BadRequest("'messages' must contain at least one message.", param="messages")
    tools = request.tools or None
    model = model.tool_use if tools and model.tool_use is not None else model
    messages = [_turn(i, m, model) for i, m in enumerate(request.messages)]
    if tools and plan is not None and plan.auto and not model.shows_tools:
        messages = _briefed(messages, _tools.brief(tools))
    prefill = bool(request.continue_final_message)
    if prefill and request.add_generation_prompt:
        raise BadRequest(
            "'continue_final_message' goes on with the last message: it cannot have "
            "'add_generation_prompt' too.", param="continue_final_message",
        )  # fmt: skip
    turn = request.add_generation_prompt is not False
    extra = _template_vars(request, model)
    return model.encode(model.render(messages, tools, extra, turn=turn, prefill=prefill))


def _template_vars(request: ChatCompletionRequest, model: TextModel) -> dict[str, Any] | None:
    """``chat_template_kwargs``, after ``reasoning_effort`` as the template's variable of that
    name (as vLLM gives it): a 400 for a model whose template does not read it and that does
    not reason in tags (as OpenAI's models that do not reason refuse it)."""
    if request.reasoning_effort is None:
        return request.chat_template_kwargs
    if not model.reads_effort and model.think is None:
        raise BadRequest("This model does not reason: its chat template does not read "
                         "'reasoning_effort'.", param="reasoning_effort")  # fmt: skip
    return {"reasoning_effort": request.reasoning_effort, **(request.chat_template_kwargs or {})}


def _briefed(messages: list[dict[str, Any]], brief: str) -> list[dict[str, Any]]:
    """``brief`` after the first system message's text, or as a system message of its own."""
    if messages[0]["role"] == "system":
        first = messages[0] | {"content": f"{messages[0]['content']}\n\n{brief}".strip()}
        return [first, *messages[1:]]
    return [{"role": "system", "content": brief}, *messages]


def chat_chars(request: ChatCompletionRequest) -> int:
    """About how many characters the chat template renders (the messages' text)."""
    return sum(
        len(m.content) if isinstance(m.content, str)
        else sum(len(getattr(part, "text", "") or "") for part in m.content or [])
        for m in request.messages
    )  # fmt: skip


def prompt_chars(request: CompletionRequest) -> int:
    """Characters of a text completion's string prompts (what tokenizing costs)."""
    prompt = request.prompt
    if isinstance(prompt, str):
        return len(prompt)
    return sum(len(p) for p in prompt if isinstance(p, str))


def _is_ids(value: Any, vocab: int) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(type(t) is int and 0 <= t < vocab for t in value)
    )


def completion_prompts(request: CompletionRequest, model: TextModel) -> list[list[int]]:
    """A text completion's prompts: a string, token ids, or a list of either (OpenAI's forms)."""
    prompt, vocab = request.prompt, model.tokenizer.get_vocab_size()
    many: list[Any] = [prompt] if isinstance(prompt, str) or _is_ids(prompt, vocab) else prompt
    if len(many) > MAX_PROMPTS:
        raise BadRequest(
            f"'prompt' takes at most {MAX_PROMPTS} prompts per request; got {len(many)}.",
            param="prompt",
        )
    prompts = []
    for item in many:
        if isinstance(item, str) and item:
            prompts.append(model.encode(item))
        elif _is_ids(item, vocab):
            prompts.append(list(item))
        else:
            raise BadRequest(
                "'prompt' must be a non-empty string, a list of token ids, or a list of up to "
                f"{MAX_PROMPTS} of either.",
                param="prompt",
            )
    if not prompts:
        raise BadRequest("'prompt' must not be empty.", param="prompt")
    return prompts


def stops(request: ChatCompletionRequest | CompletionRequest, marked: bool = False) -> Detokenizing:
    """The request's ``stop`` strings, and vLLM's ``include_stop_str_in_output`` and
    ``skip_special_tokens`` (off for a chat whose answer is read by its special tokens,
    ``marked``: harmony's, which ``_harmony`` takes out, or calls', ``_tools.marked``)."""
    value = request.stop
    stops = [value] if isinstance(value, str) else list(value or [])
    if len(stops) > MAX_STOP or not all(stops):
        raise BadRequest(f"'stop' takes up to {MAX_STOP} non-empty strings.", param="stop")
    return Detokenizing(tuple(stops), include_stop=bool(request.include_stop_str_in_output),
                        skip_special=request.skip_special_tokens is not False and not marked,
                        min_tokens=request.min_tokens or 0,
                        stop_ids=tuple(request.stop_token_ids or ()))  # fmt: skip


class ContextTooLong(BadRequest):
    """The prompt and the completion asked for do not fit the model's context: ``prompt``
    tokens where ``allowed`` would."""

    def __init__(self, message: str, *, param: str, prompt: int, allowed: int) -> None:
        super().__init__(message, param=param)
        self.prompt, self.allowed = prompt, allowed


COMPLETION_TOKENS = 16
"""A text completion's ``max_tokens`` when it names none (OpenAI's and vLLM's default); a chat
completion's is the rest of the context."""


def max_tokens(
    request: ChatCompletionRequest | CompletionRequest, prompt: int, context: int,
    most: float | None = None,
) -> int:  # fmt: skip
    """The tokens a completion may make: the request's, else the rest of the context (a chat)
    or 16 (a text completion), at most the model's own default ``most`` (``max_new_tokens``)."""
    field, source = "max_tokens", "prompt"
    requested = request.max_tokens
    if isinstance(request, ChatCompletionRequest):
        source = "messages"
        if request.max_completion_tokens is not None:
            field, requested = "max_completion_tokens", request.max_completion_tokens
    if requested is not None and requested < 1:
        raise BadRequest(f"'{field}' must be at least 1.", param=field)
    room = max(1, context - prompt)
    default = room if source == "messages" else min(COMPLETION_TOKENS, room)
    default = min(default, int(most)) if most else default
    wanted = requested if requested is not None else default
    if prompt + wanted > context:
        raise ContextTooLong(
            f"This model's maximum context length is {context} tokens. However, you requested "
            f"{prompt + wanted} tokens ({prompt} in the {source}, {wanted} for the completion). "
            f"Shorten the {source} or lower '{field}'.",
            param=field if requested is not None and prompt < context else source,
            prompt=prompt, allowed=context - (requested or 1),
        )  # fmt: skip
    return wanted


def _echoes(
    request: CompletionRequest, prompts: list[list[int]], cut: list[list[int]], model: TextModel
) -> list[str]:
    """The text ``echo`` repeats for each prompt: as written, or decoded from its token ids
    (those it kept, if ``truncate_prompt_tokens`` cut it)."""
    if not request.echo:
        return [""] * len(prompts)
    given = request.prompt
    written = [given] if isinstance(given, str) or len(prompts) == 1 else list(given)
    return [
        item
        if isinstance(item, str) and len(ids) == len(whole)
        else model.tokenizer.decode(ids, skip_special_tokens=False)
        for item, whole, ids in zip(written, prompts, cut, strict=False)
    ]


async def tokenize(
    request: ChatCompletionRequest | CompletionRequest, model: TextModel, plan: ToolPlan | None,
    context: int,
) -> tuple[list[list[int]], list[str], str]:  # fmt: skip
    """The prompts' token ids (each cut to its last ``truncate_prompt_tokens``, if given),
    their ``echo`` texts and the usage endpoint."""
    keep = kept(request.truncate_prompt_tokens, context)
    with tracing.span("tokenize"):
        if isinstance(request, ChatCompletionRequest):
            chars = chat_chars(request)
            prompt = await off_loop(chars, chat_prompt, request, model, plan)
            return [prompt[-keep:] if keep else prompt], [""], "chat.completions"
        chars = prompt_chars(request)
        prompts = await off_loop(chars, completion_prompts, request, model)
        cut = [prompt[-keep:] for prompt in prompts] if keep else prompts
        return cut, _echoes(request, prompts, cut, model), "completions"
