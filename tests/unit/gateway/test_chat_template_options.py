"""vLLM's chat template options: ``chat_template_kwargs`` (more variables: a Qwen3-style
``enable_thinking`` switch here; the ones Kiln gives every template are refused by name),
``add_generation_prompt`` and ``continue_final_message`` (the model goes on with the last
message: the prompt ends inside it)."""

from __future__ import annotations

import pytest

from kiln_platform.errors import BadRequest
from kiln_platform.gateway._chat_jinja import chat_environment
from kiln_platform.gateway._textmodel import RENDERED, TextModel, continued
from tests.factories import byte_bpe

TEMPLATE = (
    "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not "
    "enable_thinking %}<think></think>{% endif %}{% endif %}"
)
SAID = [{"role": "user", "content": "Hi"}]


def _model() -> TextModel:
    template = chat_environment().from_string(TEMPLATE)
    return TextModel(tokenizer=byte_bpe(["Hi there"]), template=template,
                     bos_token="", eos_token="<eos>", eos_token_ids=(0,))  # fmt: skip


def test_template_variables_reach_the_template() -> None:
    model = _model()
    assert model.render(SAID) == "<user>Hi</user>\n<assistant>"
    assert model.render(SAID, extra={"enable_thinking": False}).endswith("<think></think>")
    assert model.render(SAID, extra={"enable_thinking": True}) == "<user>Hi</user>\n<assistant>"


@pytest.mark.parametrize("name", sorted(RENDERED))
def test_the_variables_kiln_sets_are_refused_by_name(name: str) -> None:
    with pytest.raises(BadRequest) as err:
        _model().render(SAID, extra={name: "x"})
    assert err.value.param == "chat_template_kwargs"
    assert f"'{name}'" in err.value.message


def test_the_prompt_ends_inside_the_message_it_continues() -> None:
    model = _model()
    begun = [*SAID, {"role": "assistant", "content": "Well, "}]  # the template trims it
    assert model.render(begun, prefill=True) == "<user>Hi</user>\n<assistant>Well,"
    assert model.render(SAID, turn=False) == "<user>Hi</user>\n"
    parts = [{"type": "text", "text": "Sure"}]
    assert continued("<assistant>Sure</assistant>", parts) == "<assistant>Sure"
    with pytest.raises(BadRequest) as err:
        model.render([*SAID, {"role": "assistant", "content": ""}], prefill=True)
    assert err.value.param == "continue_final_message"
