"""What the gateway needs of an LLM version: its tokenizer, chat template and end tokens."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from jinja2.exceptions import TemplateError

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._call_formats import HERMES, CallFormat
from kiln_platform.gateway._chat_jinja import chat_environment
from kiln_platform.gateway._harmony import harmony_ids
from kiln_platform.gateway._items import text_of
from kiln_platform.gateway._reasoning import Think, think_ids
from kiln_platform.gateway._taught import taught
from kiln_platform.gateway.services import load_tokenizer
from kiln_runtimes.byte_level import BYTE_OF

if TYPE_CHECKING:
    from pathlib import Path

    from jinja2 import Template
    from tokenizers import Tokenizer


RENDERED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})
"""The variables ``TextModel.render`` gives every chat template."""


@dataclass(frozen=True)
class TextModel:
    """Tokenizer, chat template and the token ids that end a generation."""

    tokenizer: Tokenizer
    template: Template | None
    bos_token: str
    eos_token: str
    eos_token_ids: tuple[int, ...]
    tool_aware: bool = False
    """The chat template renders assistant ``tool_calls`` itself."""
    shows_tools: bool = False
    """The chat template renders the ``tools`` a request offers."""
    tool_use: TextModel | None = None
    """The model with its ``tool_use`` chat template, for requests that offer tools (as
    ``apply_chat_template`` picks it)."""
    think: Think | None = None
    """Its reasoning tags (``<think>`` and ``</think>``) if it reasons in them (``_reasoning``)."""
    reads_effort: bool = False
    """The chat template reads ``reasoning_effort`` (gpt-oss's does)."""
    harmony: tuple[int, int, int, int] | None = None
    """Its harmony markers' ids if it answers in harmony's channels (gpt-oss's,
    ``_harmony.harmony_ids``)."""
    nine_ids: bool = False
    """The chat template refuses call ids other than nine characters (Mistral's)."""
    calls: CallFormat = HERMES
    """How the chat template teaches the model to call tools (``_call_formats``)."""
    _bytes: dict[int, bytes] = field(default_factory=dict, compare=False, repr=False)

    @property
    def reasons(self) -> bool:
        """Whether its answers carry reasoning (in tags, or on harmony's channels)."""
        return self.think is not None or self.harmony is not None

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one token stands for (exact for byte-level BPE, where a token may be part
        of a UTF-8 character), as ``logprobs`` report them."""
        found = self._bytes.get(token_id)
        if found is None:
            piece = self.tokenizer.id_to_token(token_id) or ""
            if type(self.tokenizer.decoder).__name__ == "ByteLevel" and all(
                c in BYTE_OF for c in piece
            ):
                found = bytes(BYTE_OF[c] for c in piece)
            else:
                found = self.tokenizer.decode([token_id], skip_special_tokens=False).encode()
            self._bytes[token_id] = found
        return found

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
        extra: dict[str, Any] | None = None, *, turn: bool = True, prefill: bool = False,
    ) -> str:  # fmt: skip
        """The prompt text for a conversation (and the tools it may call, for templates that
        show them), ending with the assistant's turn (``turn``: vLLM's
        ``add_generation_prompt``), or ``prefill``: inside the last message, which the model
        then goes on with (vLLM's ``continue_final_message``). ``extra``: more template
        variables (vLLM's ``chat_template_kwargs``), none of those set here."""
        if self.template is None:
            raise BadRequest("This model has no chat template; use /v1/completions.", param="model")
        if clash := sorted(RENDERED & (extra or {}).keys()):
            raise BadRequest(f"'chat_template_kwargs' may not set '{clash[0]}' (Kiln does).",
                             param="chat_template_kwargs")  # fmt: skip
        try:
            text = self.template.render(
                **(extra or {}),
                messages=messages,
                tools=tools,
                add_generation_prompt=turn and not prefill,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except TemplateError as exc:
            raise BadRequest(
                f"The chat template rejected the messages: {exc}", param="messages"
            ) from exc
        return continued(text, messages[-1].get("content")) if prefill else text

    def encode(self, text: str) -> list[int]:
        """Token ids of prompt text (special tokens written in the text are recognised).

        ``encode_batch`` releases the GIL while it works (``encode`` does not), so a long
        prompt tokenized in a thread leaves the event loop running.
        """
        return list(self.tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)


def continued(text: str, final: Any) -> str:
    """``text`` cut right after the last message's own text (as ``apply_chat_template`` does
    for ``continue_final_message``, stripped if the template trims it), so the model goes on
    with that message instead of closing it."""
    final = text_of(final)
    for said in (final, final.strip()):
        if said and (at := text.rfind(said)) >= 0:
            return text[: at + len(said)]
    raise BadRequest("'continue_final_message' needs a last message with text the chat template "
                     "shows.", param="continue_final_message")  # fmt: skip


def _token(value: Any) -> str:
    return str(value.get("content", "")) if isinstance(value, dict) else str(value or "")


@lru_cache(maxsize=16)
def load_text_model(model_dir: Path, tokenizer_file: str) -> TextModel:
    """Read a built LLM folder (``tokenizer_config.json``, ``genai_config.json``)."""
    config: dict[str, Any] = {}
    if (model_dir / "tokenizer_config.json").exists():
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
    source = config.get("chat_template")
    if (model_dir / "chat_template.jinja").exists():
        source = (model_dir / "chat_template.jinja").read_text()
    tokenizer = load_tokenizer(model_dir / tokenizer_file)
    eos_token = _token(config.get("eos_token"))
    eos_ids = set()
    if (model_dir / "genai_config.json").exists():
        declared = json.loads((model_dir / "genai_config.json").read_text())["model"].get(
            "eos_token_id"
        )
        eos_ids.update(
            declared if isinstance(declared, list) else [declared] if declared is not None else []
        )
    if eos_token and tokenizer.token_to_id(eos_token) is not None:
        eos_ids.add(tokenizer.token_to_id(eos_token))
    model = TextModel(
        tokenizer=tokenizer, template=None, bos_token=_token(config.get("bos_token")),
        eos_token=eos_token, eos_token_ids=tuple(sorted(eos_ids)), think=think_ids(tokenizer),
        harmony=harmony_ids(tokenizer),
    )  # fmt: skip
    tool_use = model_dir / "additional_chat_templates" / "tool_use.jinja"
    if tool_use.is_file():
        model = replace(model, tool_use=_templated(model, tool_use.read_text()))
    return _templated(model, source) if source else model


def _templated(model: TextModel, source: str) -> TextModel:
    """``model`` with the chat template ``source``."""
    shows_tools = bool(re.search(r"\btools\b", source))
    return replace(
        model, template=chat_environment().from_string(source),
        tool_aware="tool_calls" in source, shows_tools=shows_tools,
        reads_effort=bool(re.search(r"\breasoning_effort\b", source)),
        calls=taught(source, model.tokenizer) if shows_tools else HERMES,
        nine_ids=bool(re.search(r"length\s*!=\s*9\b", source)),
    )  # fmt: skip
