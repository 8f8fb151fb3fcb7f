"""A completion's sampling parameters, validated (OpenAI's ranges) into the worker's terms."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._reasoning import Split
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest, CompletionRequest
from kiln_runtimes.protocol import MAX_LOGPROBS, ThinkBudget

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from kiln_platform.gateway._textmodel import TextModel

MAX_N = 16
"""Choices one request may ask for (each is its own sequence on a worker)."""
MAX_SEQUENCES = 64
"""Sequences one request may start in all: ``n`` times its prompts."""
MAX_LOGIT_BIAS = 300
MAX_STOP_TOKEN_IDS = 64


@dataclass(frozen=True, slots=True)
class Sampling:
    """How many choices, their seed, and the ``GenerateRequest`` fields every choice shares."""

    n: int
    seed: int | None
    fields: dict[str, Any] = field(default_factory=dict)
    most: float | None = None
    """The model's own ``max_tokens`` default (``max_new_tokens``), for a request without one."""

    def seed_of(self, index: int) -> int | None:
        """Choice ``index``'s seed: the request's own for choice 0 (so ``n=1`` is unchanged),
        a stable hash of (seed, index) for the others, so a seeded request repeats exactly."""
        if self.seed is None or index == 0:
            return self.seed
        digest = hashlib.blake2b(f"{self.seed}:{index}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") >> 1


def _between(name: str, value: float | None, low: float, high: float, default: float) -> float:
    if value is None:
        return default
    if not low <= value <= high:
        raise BadRequest(f"'{name}' must be between {low:g} and {high:g}.", param=name)
    return value


def _seed(value: int | None) -> int | None:
    """``seed`` as vLLM takes it (any 64-bit signed integer), as the worker's generator takes
    it: non-negative, one for one (a negative one wraps to 2**64 + seed)."""
    if value is None:
        return None
    if not -(2**63) <= value < 2**63:
        raise BadRequest("'seed' must be a 64-bit integer.", param="seed")
    return value % 2**64


def _n(request: ChatCompletionRequest | CompletionRequest, prompts: int) -> int:
    n = 1 if request.n is None else request.n
    if not 1 <= n <= MAX_N:
        raise BadRequest(f"'n' must be between 1 and {MAX_N}; got {n}.", param="n")
    if n * prompts > MAX_SEQUENCES:
        raise BadRequest(
            f"'n' times the number of prompts must be at most {MAX_SEQUENCES}; got "
            f"{n} x {prompts}.",
            param="n",
        )
    return n


def _top_k(value: int | None) -> int:
    if value is None or value in (-1, 0):
        return 0
    if value < 1:
        raise BadRequest("'top_k' must be -1 or 0 (off), or at least 1.", param="top_k")
    return value


def _logit_bias(value: dict[str, float] | None, vocab: int) -> dict[int, float]:
    if not value:
        return {}
    if len(value) > MAX_LOGIT_BIAS:
        raise BadRequest(f"'logit_bias' takes at most {MAX_LOGIT_BIAS} tokens.", param="logit_bias")
    bias = {}
    for key, amount in value.items():
        token = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= token < vocab:
            raise BadRequest(
                f"'logit_bias' key '{key}' is not a token id of this model (0 to {vocab - 1}).",
                param="logit_bias",
            )
        if not -100 <= amount <= 100:
            raise BadRequest(
                f"'logit_bias' values must be between -100 and 100; '{key}' has {amount:g}.",
                param="logit_bias",
            )
        bias[token] = float(amount)
    return bias


def _logprobs(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    """How many alternatives the worker reports per token (``None``: no logprobs)."""
    if isinstance(request, CompletionRequest):
        if request.logprobs is not None:
            _between("logprobs", request.logprobs, 0, MAX_LOGPROBS, 0)
        return request.logprobs
    top = request.top_logprobs
    if top is not None:
        _between("top_logprobs", top, 0, MAX_LOGPROBS, 0)
        if not request.logprobs and top:
            raise BadRequest("'top_logprobs' needs 'logprobs' set to true.", param="top_logprobs")
    return (top or 0) if request.logprobs else None


def _scored(request: ChatCompletionRequest | CompletionRequest) -> int | None:
    """Alternatives per prompt token the worker scores its prompt with: vLLM's
    ``prompt_logprobs`` or an echoed prompt's ``logprobs``, the more of them; ``None``: the
    prompt is not scored."""
    asked = request.prompt_logprobs
    if asked is not None:
        _between("prompt_logprobs", asked, 0, MAX_LOGPROBS, 0)
        if request.stream:
            raise BadRequest("'prompt_logprobs' cannot be streamed (as vLLM): leave out "
                             "'stream'.", param="prompt_logprobs")  # fmt: skip
    echoed = request.logprobs if isinstance(request, CompletionRequest) and request.echo else None
    both = [k for k in (asked, echoed) if k is not None]
    return max(both) if both else None


def _ends(
    request: ChatCompletionRequest | CompletionRequest, vocab: int, eos: set[int], grammar: bool
) -> dict[str, Any]:
    """vLLM's ``stop_token_ids``, ``ignore_eos`` and ``min_tokens``, checked, as the worker's
    ``stop_token_ids`` (the model's ``eos`` unless ignored, and the request's), ``ignore_eos``
    and ``min_tokens``."""
    extra = request.stop_token_ids or []
    if len(extra) > MAX_STOP_TOKEN_IDS or not all(0 <= t < vocab for t in extra):
        raise BadRequest(f"'stop_token_ids' takes up to {MAX_STOP_TOKEN_IDS} token ids of this "
                         f"model (0 to {vocab - 1}).", param="stop_token_ids")  # fmt: skip
    least, ignore = request.min_tokens or 0, bool(request.ignore_eos)
    most = getattr(request, "max_completion_tokens", None) or request.max_tokens
    if least < 0 or (most is not None and least > most):
        raise BadRequest("'min_tokens' must be between 0 and 'max_tokens'.", param="min_tokens")
    for name, used in (("ignore_eos", ignore), ("min_tokens", least)):
        if grammar and used:
            raise BadRequest(f"'{name}' cannot be used with structured outputs or required tool "
                             "calls: their grammar ends the answer.", param=name)  # fmt: skip
    stops = set(extra) if ignore else eos | set(extra)
    return {"stop_token_ids": sorted(stops), "ignore_eos": ignore, "min_tokens": least}


def sampling(
    request: ChatCompletionRequest | CompletionRequest, vocab: int, prompts: int = 1, *,
    eos: set[int] | None = None, grammar: str | None = None,
    defaults: Mapping[str, float] | None = None,
) -> Sampling:  # fmt: skip
    """Validate every sampling parameter; a 400 names the first one out of range. ``eos``: the
    model's end-of-sequence tokens; ``grammar``: the one the answer follows (it ends itself);
    ``defaults``: the model's own, for a parameter the request leaves out (else OpenAI's)."""

    def given(name: str) -> Any:
        value = getattr(request, name)
        return (defaults or {}).get(name) if value is None else value

    temperature = _between("temperature", given("temperature"), 0, 2, 1.0)
    top_p = 1.0 if given("top_p") is None else given("top_p")
    if not 0.0 <= top_p <= 1.0:
        raise BadRequest("'top_p' must be between 0 and 1.", param="top_p")
    top_k = _top_k(None if given("top_k") is None else int(given("top_k")))
    if top_p == 0:  # OpenAI takes it: the smallest nucleus, the most probable token alone
        top_p, top_k = 1.0, 1
    repetition = 1.0 if given("repetition_penalty") is None else given("repetition_penalty")
    if not 0 < repetition <= 2:
        raise BadRequest(
            "'repetition_penalty' must be greater than 0 and at most 2.",
            param="repetition_penalty",
        )
    fields = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": _between("min_p", given("min_p"), 0, 1, 0.0),
        "presence_penalty": _between("presence_penalty", request.presence_penalty, -2, 2, 0.0),
        "frequency_penalty": _between("frequency_penalty", request.frequency_penalty, -2, 2, 0.0),
        "repetition_penalty": repetition,
        "logit_bias": _logit_bias(request.logit_bias, vocab),
        "logprobs": _logprobs(request),
        "prompt_logprobs": _scored(request),
        **_ends(request, vocab, eos or set(), grammar is not None),
    }
    most = (defaults or {}).get("max_tokens")
    return Sampling(_n(request, prompts), _seed(request.seed), fields, most)


def think_budget(
    request: ChatCompletionRequest | CompletionRequest, model: TextModel | None,
    prompt: Sequence[int],
) -> ThinkBudget | None:  # fmt: skip
    """vLLM's ``thinking_token_budget`` of a chat (``model``: the chat's; ``None``, or a model
    that does not reason, ignores it): its reasoning is closed once it has written so many
    tokens (0: at once). A negative budget is a 400 naming it."""
    budget = getattr(request, "thinking_token_budget", None)
    if budget is None or model is None or not model.reasons:
        return None
    if budget < 0:
        raise BadRequest("'thinking_token_budget' must be at least 0.",
                         param="thinking_token_budget")  # fmt: skip
    if model.harmony is not None:
        return _harmony_budget(model, model.harmony, budget)
    think = model.think
    assert think is not None  # it reasons, in tags
    inside = Split.after(think, prompt).state == "inside"
    return ThinkBudget(open=think.open_id, close=think.close_id, tokens=budget, inside=inside)


def _harmony_budget(
    model: TextModel, harmony: tuple[int, int, int, int], budget: int
) -> ThinkBudget:
    """gpt-oss's: its analysis message (counted from the ``<|message|>`` right after
    ``analysis``) is ended by ``<|end|>``, and the final message's header follows."""
    start, channel, message, end = harmony
    word = {w: model.tokenizer.encode(w, add_special_tokens=False).ids
            for w in ("analysis", "assistant", "final")}  # fmt: skip
    then = (start, *word["assistant"], channel, *word["final"], message)
    return ThinkBudget(open=message, close=end, tokens=budget, inside=False,
                       after=word["analysis"][-1], then=then)  # fmt: skip
