"""Which call format a chat template teaches (``_call_formats``, ``_tagged_calls``), read from
its text and its tokenizer at load, as vLLM's operators pick ``--tool-call-parser`` by hand and
llama.cpp sniffs the template: Hermes' unless the template teaches another this reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.gateway._call_formats import (
    HERMES,
    JSON,
    Apertus,
    CallFormat,
    HarmonyCalls,
    Mistral,
    MistralArgs,
)
from kiln_platform.gateway._harmony import harmony_ids
from kiln_platform.gateway._python_calls import Pythonic
from kiln_platform.gateway._tagged_calls import GLM, GLM47, MINIMAX, SEED, XML

if TYPE_CHECKING:
    from tokenizers import Tokenizer

GRANITE = "<|tool_call|>"
"""Granite 3's token before its calls."""


def taught(template: str, tokenizer: Tokenizer) -> CallFormat:
    """The format ``template`` teaches (its tags the tokenizer's special tokens, where they
    are, ``CallFormat.spoken``)."""
    harmony, constrain = harmony_ids(tokenizer), tokenizer.token_to_id("<|constrain|>")
    if harmony is not None and constrain is not None:
        return HarmonyCalls(harmony, constrain)
    tagged = _tagged(template)
    if tagged is not None:
        return tagged.spoken(tokenizer)
    if '"parameters": dictionary of argument name' in template:
        return JSON
    for made in (Apertus, Pythonic):
        first, last = (tokenizer.token_to_id(tag) for tag in (made.open, made.close))
        if made.open in template and first is not None and last is not None:
            return made(first, last)
    return _mistral(template, tokenizer)


def _tagged(template: str) -> CallFormat | None:
    """A tag-shaped format (``_tagged_calls``), if the template teaches one (the more
    particular tells first: Seed-OSS's block holds Qwen's ``<function=``)."""
    if MINIMAX.open in template:
        return MINIMAX
    if SEED.open in template and "<function=" in template:
        return SEED
    if "<function=" in template and "<parameter=" in template:
        return XML
    if "<arg_key>" in template and "<arg_value>" in template:
        return GLM47 if "</arg_key><arg_value>" in template else GLM
    return None


def _mistral(template: str, tokenizer: Tokenizer) -> CallFormat:
    """Mistral's formats, taught by a template that writes its tokenizer's ``[TOOL_CALLS]``
    (or Granite 3's ``<|tool_call|>``, then Mistral's list)."""
    mistral, args = tokenizer.token_to_id(Mistral.marker), tokenizer.token_to_id("[ARGS]")
    granite = tokenizer.token_to_id(GRANITE)
    if mistral is None or Mistral.marker not in template:
        if granite is None or GRANITE not in template:
            return HERMES.spoken(tokenizer)
        return Mistral(granite, GRANITE)
    if "[ARGS]" not in template:
        return Mistral(mistral)
    return MistralArgs(mistral, args) if args is not None else HERMES.spoken(tokenizer)
