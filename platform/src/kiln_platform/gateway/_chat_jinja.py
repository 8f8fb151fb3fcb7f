"""The sandbox chat templates render in, built as Hugging Face's ``apply_chat_template`` builds
it (transformers' ``chat_template_utils``), so a template that renders there renders here:
``{% break %}`` and ``{% continue %}``, the ``{% generation %}`` tag (its body, rendered as is:
it marks the assistant's tokens for training), ``raise_exception``, ``strftime_now`` (Llama
3.x's templates write today's date with it), ``dict``, a ``namespace`` that refuses
underscore-prefixed names, and ``tojson`` with ``json.dumps``'s options."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from jinja2 import nodes
from jinja2.exceptions import SecurityError, TemplateError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

if TYPE_CHECKING:
    from collections.abc import Callable

    from jinja2.parser import Parser


class _Generation(Extension):
    """``{% generation %}…{% endgeneration %}``: the body, rendered as is."""

    tags = {"generation"}  # noqa: RUF012 (jinja's own class attribute)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Callable[[], str]) -> str:
        return caller()


class _Namespace(Namespace):
    """jinja's ``namespace`` without underscore-prefixed attributes (CPython's internals)."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise SecurityError(f"a chat template cannot set {name!r} on a namespace")


def _raise(message: str) -> None:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)  # fmt: skip


def chat_environment() -> ImmutableSandboxedEnvironment:
    """A fresh sandbox with Hugging Face's extensions, filters and globals."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(
        raise_exception=_raise,
        namespace=_Namespace,
        dict=dict,
        strftime_now=lambda fmt: datetime.now().strftime(fmt),
    )
    return env
