"""A model's tokens without a generation: the prompt counts other handlers ask for
(``POST /v1/responses/input_tokens``, ``truncation: auto``), and vLLM's ``POST /tokenize`` and
``POST /detokenize``. The tokenizer and chat template are the ones a completion uses, and a
prompt is tokenized exactly as ``llm.prepare`` tokenizes it; nothing is held, run or billed, and
none of it counts in the model's SLOs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from kiln_platform.errors import BadRequest
from kiln_platform.gateway import _prompts, _tools, llm
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest, Message

if TYPE_CHECKING:
    from kiln_platform.admission.services import Admission
    from kiln_platform.context import Kiln
    from kiln_platform.gateway._textmodel import TextModel
    from kiln_platform.registry.services import ResolvedVersion


class TokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /tokenize`` (vLLM's): a completion's ``prompt``, or a chat's ``messages`` with
    the chat template's options."""

    model: str
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: Any = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_special_tokens: bool | None = None
    """Accepted and unused: Kiln adds no special token to a prompt (a chat template writes a
    chat's own), so the count is what a completion is billed."""
    return_token_strs: bool = False


class TokenizeResponse(msgspec.Struct, kw_only=True):
    """The prompt's token ids, their count, the model's context length, and (if asked) each
    token as the tokenizer's vocabulary writes it."""

    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /detokenize`` (vLLM's)."""

    model: str
    tokens: list[int]


class DetokenizeResponse(msgspec.Struct, kw_only=True):
    prompt: str


async def _model(kiln: Kiln, admission: Admission, name: str) -> tuple[ResolvedVersion, TextModel]:
    """The version serving ``name`` and its tokenizer (not counted in its SLOs)."""
    version, _ = await llm.resolve(kiln, admission, name, slo=False)
    return version, await llm.text_model(kiln, version)


async def count_prompt(kiln: Kiln, admission: Admission, request: ChatCompletionRequest) -> int:
    """The prompt tokens ``request`` takes as ``llm.prepare`` tokenizes it."""
    tools = _tools.plan(request.tools, request.tool_choice, request.parallel_tool_calls)
    version, model = await _model(kiln, admission, request.model)
    prompts, _, _ = await _prompts.tokenize(request, model, tools, version.context_length)
    return sum(map(len, prompts))


def _as_request(data: TokenizeRequest) -> ChatCompletionRequest | CompletionRequest:
    """The completion whose prompt ``data`` asks about: a chat if it has ``messages``."""
    if (data.prompt is None) == (data.messages is None):
        raise BadRequest("Give 'prompt' or 'messages', not both.", param="prompt")
    if data.prompt is not None:
        if data.tools is not None or data.chat_template_kwargs is not None:
            raise BadRequest("'prompt' is tokenized as it is: no chat template options.",
                             param="prompt")  # fmt: skip
        return CompletionRequest(model=data.model, prompt=data.prompt)
    return ChatCompletionRequest(
        model=data.model, messages=data.messages or [], tools=data.tools,
        add_generation_prompt=data.add_generation_prompt,
        continue_final_message=data.continue_final_message,
        chat_template_kwargs=data.chat_template_kwargs,
    )  # fmt: skip


async def tokenize(kiln: Kiln, admission: Admission, data: TokenizeRequest) -> TokenizeResponse:
    """``POST /tokenize``."""
    request = _as_request(data)
    version, model = await _model(kiln, admission, data.model)
    plan = None
    if isinstance(request, ChatCompletionRequest):
        plan = _tools.plan(request.tools, None, None)
    (ids,), _, _ = await _prompts.tokenize(request, model, plan, version.context_length)
    strs = [model.tokenizer.id_to_token(i) or "" for i in ids] if data.return_token_strs else None
    return TokenizeResponse(count=len(ids), max_model_len=version.context_length, tokens=ids,
                            token_strs=strs)  # fmt: skip


async def detokenize(
    kiln: Kiln, admission: Admission, data: DetokenizeRequest
) -> DetokenizeResponse:
    """``POST /detokenize``: the text of token ids, special tokens included (vLLM's)."""
    _, model = await _model(kiln, admission, data.model)
    vocab = model.tokenizer.get_vocab_size()
    if not all(0 <= token < vocab for token in data.tokens):
        raise BadRequest(f"'tokens' must be token ids of this model (0 to {vocab - 1}).",
                         param="tokens")  # fmt: skip
    return DetokenizeResponse(prompt=model.tokenizer.decode(data.tokens, skip_special_tokens=False))
