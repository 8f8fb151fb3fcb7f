"""Chat templates render here as Hugging Face's ``apply_chat_template`` renders them."""

from __future__ import annotations

import datetime

import pytest
from jinja2.exceptions import SecurityError, TemplateError

from kiln_platform.gateway._chat_jinja import chat_environment

pytestmark = pytest.mark.unit


def render(source: str, **variables: object) -> str:
    return chat_environment().from_string(source).render(**variables)


def test_what_hub_templates_use_renders() -> None:
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                {"role": "assistant", "content": "a"}]  # fmt: skip
    # loop controls (Qwen3's last-query scan), the generation tag (assistant masks)
    loop = ("{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
            "{% if m.role == 'assistant' %}{% generation %}[{{ m.content }}]{% endgeneration %}"
            "{% break %}{% endif %}{{ m.content }}{% endfor %}")  # fmt: skip
    assert render(loop, messages=messages) == "u[a]"
    # Llama 3.x: today's date when the caller gives none
    today = datetime.datetime.now().strftime("%d %b %Y")
    assert render("{{ strftime_now('%d %b %Y') }}") == today
    keyed = render("{{ {'b': 1, 'a': 'é'} | tojson(sort_keys=true) }}")
    assert keyed == '{"a": "é", "b": 1}'
    assert render("{{ x | tojson(indent=2) }}", x=[1]) == "[\n  1\n]"
    assert render("{% set ns = namespace(n=1) %}{% set ns.n = ns.n + 1 %}{{ ns.n }}") == "2"
    assert render("{{ dict(a=1)['a'] }}") == "1"
    with pytest.raises(TemplateError, match="no system"):
        render("{{ raise_exception('no system') }}")


def test_a_namespace_refuses_underscore_names() -> None:
    with pytest.raises(SecurityError):
        render("{% set ns = namespace(_secret=1) %}")
