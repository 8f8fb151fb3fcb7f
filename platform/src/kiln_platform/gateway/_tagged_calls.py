"""Calls written as tags, a block per call: the function's name, then each parameter's name
and value, as vLLM's ``qwen3_coder``, ``seed_oss``, ``glm45``, ``glm47`` and ``minimax_m2``
parsers read them.

- ``XML`` (Qwen3-Coder, Qwen 3.5): ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE
  \\n</parameter>\\n…</function>\\n</tool_call>``.
- ``SEED`` (Seed-OSS): ``<seed:tool_call>\\n<function=NAME>\\n<parameter=KEY>VALUE
  </parameter>\\n…</function>\\n</seed:tool_call>``.
- ``GLM`` (GLM-4.5, 4.6): ``<tool_call>NAME\\n<arg_key>KEY</arg_key>\\n<arg_value>VALUE
  </arg_value>\\n…</tool_call>``; ``GLM47`` (GLM-4.7, GLM-5) the same without the newlines.
- ``MINIMAX`` (MiniMax-M2, M2.5): one block of calls, ``<minimax:tool_call>\\n<invoke
  name="NAME">\\n<parameter name="KEY">VALUE</parameter>\\n…</invoke>\\n…</minimax:tool_call>``.

A plain string parameter is its raw text (its templates write it so), anything else JSON held
to its schema; parameters come in their schema's order, the required ones required.
"""

from __future__ import annotations

import json
import re
from typing import Any

from kiln_platform.gateway._call_formats import CallFormat, held, lark_re
from kiln_platform.gateway._call_values import choices, raw

_DEFS = ("$defs", "definitions")
_TAG = re.compile(r"</?[\w:|]+>")
"""A tag of a format's text (``<function=NAME>`` is none: its name varies)."""
_NAME = r"([^<>\n]+)"
"""A function's or parameter's name in a call's text."""


class Tagged(CallFormat):
    """One family's tags: ``opening`` a call, ``head`` and ``key`` with ``{}`` for the
    function's and the parameter's name, ``end`` after each value, ``close`` ending the call."""

    def __init__(self, opening: str, head: str, key: str, end: str, close: str) -> None:
        self.opening, self.head, self.key, self.end, self.close = opening, head, key, end, close
        self.open = opening.strip()
        self.pattern = lark_re(self.open)
        (head_0, head_1), (key_0, key_1) = head.split("{}"), key.split("{}")
        self._calls = re.compile(
            f"{re.escape(opening + head_0)}{_NAME}{re.escape(head_1)}(.*?){re.escape(close)}",
            re.DOTALL,
        )
        self._parameters = re.compile(
            f"{re.escape(key_0)}{_NAME}{re.escape(key_1)}(.*?){re.escape(end)}", re.DOTALL
        )

    def tags(self) -> tuple[str, ...]:
        parts = (self.opening, self.head, self.key, self.end, self.close)
        return tuple(tag for part in parts for tag in _TAG.findall(part))

    def body(self, functions: dict[str, dict[str, Any]], parallel: bool) -> str:
        alternatives = " | ".join(f"f{i}" for i in range(len(functions)))
        lines = [self.calls_in_body(parallel), f"one: ({alternatives}) {self.lit(self.close)}",
                 *self._value()]  # fmt: skip
        for i, (name, params) in enumerate(functions.items()):
            lines.extend(self._function(f"f{i}", name, params))
        return "\n".join(lines)

    def _value(self) -> list[str]:
        """Lark defining ``value``: a raw value and the ``end`` after it (the first ``end``
        ends it; a special token in ``end`` ends the text lexeme, which cannot hold it)."""
        special = min((self.end.find(t) for t in self.specials if t in self.end), default=-1)
        if special < 0:
            end = lark_re(self.end)
            return ["value: VALUE", f"VALUE: /(.|\\n)*{end}/ & ~/(.|\\n)*{end}(.|\\n)+/"]
        before = lark_re(self.end[:special])
        return [f"value: VALUE {self.lit(self.end[special:])}", f"VALUE: /(.|\\n)*{before}/"]

    def calls_in_body(self, parallel: bool) -> str:
        """Lark defining ``body`` by ``one``, a call and its ``close``."""
        del parallel
        return "body: one"

    def _function(self, rule: str, name: str, params: dict[str, Any]) -> list[str]:
        """Lark for one function's call: its declared parameters in order, the required ones
        required; an object that declares none takes any, as raw text (``value``)."""
        head = self.lit(self.head.format(name))
        properties = params.get("properties")
        if not isinstance(properties, dict):
            before, after = (self.lit(part) for part in self.key.split("{}"))
            return [f"{rule}: {head} {rule}_any*",
                    f'{rule}_any: {before} /[^<>\\n]+/ {after} value']  # fmt: skip
        required = set(params.get("required", []))
        defs = {key: params[key] for key in _DEFS if key in params}
        end = self.lit(self.end)
        parts, lines = [], []
        for j, (key, schema) in enumerate(properties.items()):
            given = choices(schema) if isinstance(schema, dict) else None
            if given:
                value = "(" + " | ".join(f"{json.dumps(c)} {end}" for c in given) + ")"
            else:
                value = "value" if raw(schema) else f"%json {held(schema | defs)} {end}"
            lines.append(f"{rule}_{j}: {self.lit(self.key.format(key))} {value}")
            parts.append(f"{rule}_{j}" + ("" if key in required else "?"))
        return [f"{rule}: {head} {' '.join(parts)}", *lines]

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        calls = []
        for name, body in self._calls.findall(text):
            properties = functions[name].get("properties", {})
            calls.append((name, {
                key: value if raw(properties.get(key)) else json.loads(value)
                for key, value in self._parameters.findall(body)
            }))  # fmt: skip
        return calls


class Block(Tagged):
    """Calls in one block (MiniMax-M2's): ``opening``, each call (its ``head``, parameters and
    ``close``), then ``last``."""

    blocked = True

    def __init__(self, opening: str, head: str, key: str, end: str, close: str, *, last: str
                 ) -> None:  # fmt: skip
        super().__init__(opening, head, key, end, close)
        self.last = last
        head_0, head_1 = head.split("{}")
        self._calls = re.compile(
            f"{re.escape(head_0)}{_NAME}{re.escape(head_1)}(.*?){re.escape(close)}", re.DOTALL
        )

    def calls_in_body(self, parallel: bool) -> str:
        return f"body: one{'+' if parallel else ''} {self.lit(self.last)}"

    def tags(self) -> tuple[str, ...]:
        return (*super().tags(), self.last)

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        """The calls in the block (words before it may spell a call's tags)."""
        return super().read(text[text.find(self.open) :], functions)


XML = Tagged("<tool_call>\n", "<function={}>\n", "<parameter={}>\n", "\n</parameter>\n",
             "</function>\n</tool_call>")  # fmt: skip
SEED = Tagged("<seed:tool_call>\n", "<function={}>\n", "<parameter={}>", "</parameter>\n",
              "</function>\n</seed:tool_call>")  # fmt: skip
GLM = Tagged("<tool_call>", "{}\n", "<arg_key>{}</arg_key>\n<arg_value>", "</arg_value>\n",
             "</tool_call>")  # fmt: skip
MINIMAX = Block("<minimax:tool_call>\n", '<invoke name="{}">\n', '<parameter name="{}">',
                "</parameter>\n", "</invoke>\n", last="</minimax:tool_call>")  # fmt: skip
GLM47 = Tagged("<tool_call>", "{}", "<arg_key>{}</arg_key><arg_value>", "</arg_value>",
               "</tool_call>")  # fmt: skip
