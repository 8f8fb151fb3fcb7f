"""A model with a ``tool_use`` chat template renders requests that offer tools with it, and
others with its default one, as ``apply_chat_template`` picks between named templates."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from kiln_platform.gateway._prompts import chat_prompt
from kiln_platform.gateway._textmodel import load_text_model
from kiln_platform.gateway.llm_schemas import ChatCompletionRequest
from tests.factories import byte_bpe

DEFAULT = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
TOOL_USE = (
    "{% for t in tools %}<tool>{{ t.function.name }}</tool>\n{% endfor %}"
    "{% for m in messages %}({{ m.role }}) {{ m.content }}\n"
    "{% for c in m.tool_calls or [] %}<call>{{ c.function.name }}</call>\n{% endfor %}{% endfor %}"
)
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {}}}]


def _request(**extra: object) -> ChatCompletionRequest:
    said = [{"role": "user", "content": "Hi"}]
    return msgspec.convert({"model": "m", "messages": said, **extra}, ChatCompletionRequest)


def test_tools_pick_the_tool_use_template(tmp_path: Path) -> None:
    byte_bpe(["Hi weather tool"]).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": DEFAULT}))
    (tmp_path / "additional_chat_templates").mkdir()
    (tmp_path / "additional_chat_templates" / "tool_use.jinja").write_text(TOOL_USE)
    model = load_text_model(tmp_path, "tokenizer.json")
    assert model.tool_use is not None
    assert (model.shows_tools, model.tool_use.shows_tools, model.tool_use.tool_aware) == (
        False, True, True,
    )  # fmt: skip
    decode = model.tokenizer.decode
    assert decode(chat_prompt(_request(), model)) == "[user] Hi\n"
    offered = decode(chat_prompt(_request(tools=TOOLS), model))
    assert offered == "<tool>weather</tool>\n(user) Hi\n"
    assert decode(chat_prompt(_request(tools=TOOLS, tool_choice="none"), model)) == offered
