"""How a model writes the calls it chooses to make (``tool_choice: "auto"``): the format its
chat template teaches, read from the template as vLLM's operators pick a tool parser by hand.

- ``HERMES`` (Qwen2.5, Qwen3, Hermes, SmolLM3, and any template that does not show the tools,
  which gets them in Hermes' words): ``<tool_call>\\n{"name": …, "arguments": {…}}\\n
  </tool_call>``, a block per call.
- Tag-shaped calls (``_tagged_calls``): Qwen3-Coder's and Qwen 3.5's ``<function=`` XML,
  Seed-OSS's, GLM-4.5's to 4.7's ``<arg_key>`` pairs, MiniMax-M2's ``<invoke`` block.
- ``Mistral`` (a template that writes ``[TOOL_CALLS]``, a special token of its tokenizer, and
  no ``[ARGS]``; vLLM's ``mistral``): the token, then the calls as a JSON list; Granite 3's
  the same after its ``<|tool_call|>`` (vLLM's ``granite``).
- ``MistralArgs`` (one that writes ``[TOOL_CALLS]`` and ``[ARGS]``, both its tokenizer's): a
  call is ``[TOOL_CALLS]NAME[ARGS]{…}``.
- ``Apertus`` (a template that writes ``<|tools_prefix|>``, a special token of its
  tokenizer, as is ``<|tools_suffix|>``): words, then the calls as a JSON list between them.
- ``HarmonyCalls`` (gpt-oss's tokenizer): a ``commentary`` message to ``functions.NAME``.
- ``JSON`` (Llama 3.1-3.3's ``{"name": function name, "parameters": dictionary of argument
  name and its value}``; vLLM's ``llama3_json``): the call's JSON alone, calls parted by
  ``; ``.

Each holds a call's name to the offered functions and its arguments to the function's schema
(a format's ``rules`` are Lark lines defining ``calls``; ``read`` takes them back).
"""

from __future__ import annotations

import copy
import json
import re
from typing import TYPE_CHECKING, Any

from kiln_platform.gateway._structured import JSON_STYLE

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def held(schema: dict[str, Any]) -> str:
    """``schema`` as a Lark ``%json`` argument, written as the templates write JSON."""
    return json.dumps(schema | {"x-guidance": JSON_STYLE})


class CallFormat:
    """Hermes' calls: the base the others vary."""

    open = "<tool_call>"
    """What a call starts with (past blank space): text that does not is the model's answer."""
    pattern = open
    """``open`` as a regular expression."""
    opening = "<tool_call>\n"
    """``open`` and what always follows it: the text before a call's ``body``."""
    marker = ""
    """A special token the calls open with (left out of the text unless asked for)."""
    prefaced = True
    """Words may come before the calls (the answer's text, then its calls)."""
    blocked = False
    """One block holds all the calls (else each call is a block of its own)."""
    specials: dict[str, int] = {}  # noqa: RUF012 (replaced, never changed)
    """Its tags the model's tokenizer has as special tokens, and their ids (``spoken``)."""
    _call = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)

    @property
    def marked(self) -> bool:
        """Its tags are special tokens: a chat's text keeps them when it may call (vLLM's
        parsers turn ``skip_special_tokens`` off for theirs)."""
        return bool(self.specials)

    def tags(self) -> tuple[str, ...]:
        """The tags its grammar writes as text (a tokenizer may have them as special tokens)."""
        return ("<tool_call>", "</tool_call>")

    def spoken(self, tokenizer: Tokenizer) -> CallFormat:
        """This format for ``tokenizer``: a tag it has as a special token (Hermes' in some
        fine-tunes) is that token in the grammar, and kept in the chat's text (``marked``)."""
        found = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()
                 if t.special and t.content in self.tags()}  # fmt: skip
        if not found:
            return self
        made = copy.copy(self)
        made.specials = found
        return made

    def lit(self, text: str) -> str:
        """``text`` as a Lark sequence: strings, and the special tokens among its tags."""
        if not self.specials:
            return json.dumps(text)
        pieces = re.split("(" + "|".join(map(re.escape, self.specials)) + ")", text)
        return " ".join(f"<[{self.specials[p]}]>" if p in self.specials else json.dumps(p)
                        for p in pieces if p)  # fmt: skip

    def grammar(
        self, functions: dict[str, dict[str, Any]], answer: dict[str, Any] | None, parallel: bool
    ) -> str:
        """The Lark of an answer that is text (or JSON following ``answer``, a schema) or
        calls, one or (``parallel``) more."""
        name, rule = "TEXT", self.free_text()
        if answer is not None:
            name, rule = "answer", f"answer: BLANK? %json {held(answer)}\n{BLANK}"
        calls = self.rules(functions, answer is not None, parallel)
        return f"start: {name} | calls\n{rule}\n{calls}"

    def rules(self, functions: dict[str, dict[str, Any]], answered: bool, parallel: bool) -> str:
        """Lark defining ``calls``, one or (``parallel``) more, words before them or not
        (``answered``: beside a JSON answer, not text: no words)."""
        opening, tag = lark_re(self.opening), lark_re(self.open)
        lines = [self.body(functions, parallel), f"OPENING: /[ \\t\\r\\n]{{0,4}}{opening}/",
                 "call: OPENING body"]  # fmt: skip
        preface = [f"PREFACE: /(.|\\n)*{opening}/ & ~/(.|\\n)*{tag}(.|\\n)*{opening}/",
                   "first: PREFACE body"]  # fmt: skip
        if self.open in self.specials:  # a token no text lexeme holds: rules around it
            said = self.lit(self.opening)
            lines[1:] = ["GAP: /[ \\t\\r\\n]{1,4}/", f"call: GAP? {said} body"]
            preface = [f"first: TEXT? {said} body"]
        many = parallel and not self.blocked
        if answered:
            lines.append("calls: call+" if many else "calls: call")
        else:
            lines += [*preface, "calls: first call*" if many else "calls: first"]
        return "\n".join(lines) + "\n"

    def body(self, functions: dict[str, dict[str, Any]], parallel: bool) -> str:
        """Lark defining ``body``: a call past its opening (or, ``blocked``, the block's
        calls, one or (``parallel``) more)."""
        del parallel
        closed = self.lit("\n</tool_call>")
        return f"body: %json {held({'anyOf': schemas(functions, 'arguments')})} {closed}"

    def free_text(self) -> str:
        """The ``TEXT`` lexeme: text that holds no call (or, unless ``prefaced``, opens none),
        blank space before it or not (llguidance's ``&`` and ``~``): HTML and XML too."""
        if self.prefaced:
            return rf"TEXT: /(.|\n)+/ & ~/(.|\n)*{self.pattern}(.|\n)*/"
        return rf"TEXT: /(.|\n)+/ & ~/[ \t\r\n]*{self.pattern}(.|\n)*/"

    def begun(self, text: str) -> str:
        """``text`` past blank space (and the marker, if the text shows it)."""
        return text.lstrip().removeprefix(self.marker).lstrip() if self.marker else text.lstrip()

    def called(self, text: str) -> bool:
        """Whether a whole answer holds calls."""
        return self.open in text if self.prefaced else self.begun(text).startswith(self.open)

    def preface(self, text: str) -> str:
        """The words before an answer's calls."""
        return text[: text.find(self.open)].rstrip() if self.prefaced else ""

    def sendable(self, text: str, sent: bool) -> int:
        """How much of ``text`` (what is held of an answer, after what was ``sent``) is surely
        the answer's words: all of it once they are known not to open a call; before a call,
        or before what may yet spell its opening, and the blank space before either."""
        if not self.prefaced:
            begun = self.begun(text)
            undecided = self.open.startswith(begun) or begun.startswith(self.open)
            return len(text) if sent or not undecided else 0
        end = text.find(self.open)
        if end < 0:
            end = next((len(text) - k for k in range(min(len(self.open) - 1, len(text)), 0, -1)
                        if self.open.startswith(text[-k:])), len(text))  # fmt: skip
        return len(text[:end].rstrip())

    def bound(self, functions: dict[str, dict[str, Any]]) -> CallFormat:
        """The format for a request that offers ``functions``."""
        del functions
        return self

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        """(name, arguments) of each call in ``text``; a ``ValueError`` if it holds none."""
        del functions
        return [(c["name"], c["arguments"]) for c in map(json.loads, self._call.findall(text))]


BLANK = r"BLANK: /[ \t\r\n]{1,4}/"
"""The blank space a JSON answer may open with, as a call may (a model that opens with a
newline is not thereby held to a call)."""


def lark_re(text: str) -> str:
    """``text`` as a Lark regular expression (between slashes, on one line)."""
    return "\\n".join(re.escape(line) for line in text.split("\n")).replace("/", "\\/")


def schemas(functions: dict[str, dict[str, Any]], arguments: str) -> list[dict[str, Any]]:
    """One schema per function: its ``name`` and, under ``arguments`` (the key the format
    names them by), its parameters."""
    return [
        {"type": "object", "properties": {"name": {"const": name}, arguments: params},
         "required": ["name", arguments], "additionalProperties": False}
        for name, params in functions.items()
    ]  # fmt: skip


class Json(CallFormat):
    """Llama 3.1-3.3's calls."""

    open = '{"name": "'
    pattern = r'\{"name": "'
    prefaced = False

    def rules(self, functions: dict[str, dict[str, Any]], answered: bool, parallel: bool) -> str:
        calls = 'calls: call ("; " call)*\n' if parallel else "calls: call\n"
        if answered:  # beside a JSON answer: two JSON grammars (a lexeme would not part them)
            one = held({"anyOf": schemas(functions, "parameters")})
            return f"{calls}call: BLANK? %json {one}\n"
        alternatives, lexemes = [], []
        for i, (name, params) in enumerate(functions.items()):
            alternatives.append(f'OPEN{i} %json {held(params)} "}}"')
            lexemes.append(f'OPEN{i}: /[ \\t\\r\\n]{{0,4}}\\{{"name": "{name}", "parameters": /')
        return calls + "call: " + " | ".join(alternatives) + "\n" + "\n".join(lexemes) + "\n"

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        del functions
        decoder, calls, at = json.JSONDecoder(), [], 0
        text = text.strip()
        while at < len(text):
            call, at = decoder.raw_decode(text, at)
            calls.append((call["name"], call["parameters"]))
            at = _past(text, at, "; \t\r\n")
        return calls


def _past(text: str, at: int, chars: str) -> int:
    """Where ``text`` goes on after ``chars`` from ``at`` (between two calls)."""
    return len(text) - len(text[at:].lstrip(chars))


class Mistral(CallFormat):
    """Mistral's calls (Mistral 7B v0.3's template, for one): its ``[TOOL_CALLS]`` token (a
    special one), then the calls as a JSON list; Granite 3's the same after its
    ``<|tool_call|>`` (``marker``)."""

    open = '[{"name": "'
    pattern = r'\[\{"name": "'
    marker = "[TOOL_CALLS]"
    prefaced = False

    def __init__(self, token_id: int, marker: str = "[TOOL_CALLS]") -> None:
        self.token_id, self.marker = token_id, marker

    def rules(self, functions: dict[str, dict[str, Any]], answered: bool, parallel: bool) -> str:
        del answered
        items = schemas(functions, "arguments")
        listed = {"type": "array", "items": {"anyOf": items}, "minItems": 1}
        listed |= {} if parallel else {"maxItems": 1}
        return f'calls: <[{self.token_id}]> " "? %json {held(listed)}\n'

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        del functions
        return [(c["name"], c["arguments"]) for c in json.loads(self.begun(text))]


class MistralArgs(CallFormat):
    """Mistral's newer calls (Ministral 3's and Mistral Small 3.2's templates): each its
    ``[TOOL_CALLS]`` token, the function's name, its ``[ARGS]`` token and the arguments' JSON
    (the tokens are special: left out of the text unless asked for)."""

    marker = "[TOOL_CALLS]"
    prefaced = False
    _shown = re.compile(r"\[TOOL_CALLS\]|\[ARGS\]")

    def __init__(self, calls_id: int, args_id: int, names: tuple[str, ...] = ()) -> None:
        self.calls_id, self.args_id, self.names = calls_id, args_id, names
        self.pattern = "(" + "|".join(names) + r")\{"

    def bound(self, functions: dict[str, dict[str, Any]]) -> CallFormat:
        return MistralArgs(self.calls_id, self.args_id, tuple(functions))

    def rules(self, functions: dict[str, dict[str, Any]], answered: bool, parallel: bool) -> str:
        del answered
        calls = [f"<[{self.calls_id}]> {json.dumps(name)} <[{self.args_id}]> %json {held(params)}"
                 for name, params in functions.items()]  # fmt: skip
        return ("calls: call+" if parallel else "calls: call") + "\ncall: " + " | ".join(calls)

    def begun(self, text: str) -> str:
        return self._shown.sub("", text).lstrip()

    def called(self, text: str) -> bool:
        begun = self.begun(text)
        return any(begun.startswith(name + "{") for name in self.names)

    def sendable(self, text: str, sent: bool) -> int:
        begun = self.begun(text)
        undecided = any((name + "{").startswith(begun) for name in self.names)
        return len(text) if sent or not (undecided or self.called(text)) else 0

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        decoder, calls, at, text = json.JSONDecoder(), [], 0, self.begun(text).rstrip()
        names = sorted(functions, key=len, reverse=True)  # ``get`` is not ``get_weather``
        while at < len(text):
            name = next((n for n in names if text.startswith(n + "{", at)), None)
            if name is None:
                raise ValueError(f"no call at {at}")
            arguments, at = decoder.raw_decode(text, at + len(name))
            calls.append((name, arguments))
            at = _past(text, at, " \t\r\n")
        return calls


class Bracketed(CallFormat):
    """Calls between two special tokens of the model's tokenizer, ``open`` and ``close``, words
    before them; the chat's text keeps the tokens (``marked``), as vLLM's parsers ask."""

    close = ""

    def __init__(self, open_id: int, close_id: int) -> None:
        self.specials = {self.open: open_id, self.close: close_id}
        self.pattern = lark_re(self.open)

    def rules(self, functions: dict[str, dict[str, Any]], answered: bool, parallel: bool) -> str:
        between, *lines = self.between(functions, parallel)
        said = f"{self.lit(self.open)} {between} {self.lit(self.close)}"
        return "\n".join([f"calls: {'BLANK?' if answered else 'TEXT?'} {said}", *lines]) + "\n"

    def between(self, functions: dict[str, dict[str, Any]], parallel: bool) -> list[str]:
        """Lark for the calls between the tokens, then lines defining the rules it names."""
        raise NotImplementedError


class Apertus(Bracketed):
    """Apertus's calls: a JSON list of ``{NAME: arguments}`` objects between its
    ``<|tools_prefix|>`` and ``<|tools_suffix|>`` (vLLM's ``apertus``)."""

    open, close = "<|tools_prefix|>", "<|tools_suffix|>"

    def between(self, functions: dict[str, dict[str, Any]], parallel: bool) -> list[str]:
        items = [{"type": "object", "properties": {name: params}, "required": [name],
                  "additionalProperties": False} for name, params in functions.items()]  # fmt: skip
        listed = {"type": "array", "items": {"anyOf": items}, "minItems": 1}
        return [f"%json {held(listed | ({} if parallel else {'maxItems': 1}))}"]

    def read(self, text: str, functions: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
        del functions
        listed = text[text.index(self.open) + len(self.open) :].lstrip()
        return [next(iter(item.items())) for item in json.JSONDecoder().raw_decode(listed)[0]]


class HarmonyCalls(CallFormat):
    """gpt-oss's calls: a ``commentary`` message to ``functions.NAME`` (``<|constrain|>json``,
    then its arguments' JSON), ended by ``<|call|>``, a stop token, after any ``analysis`` or
    preamble messages; ``_harmony.Harmony`` puts each in the content as a Hermes block, which
    this reads (a preamble's words before it)."""

    def __init__(self, ids: tuple[int, int, int, int], constrain: int) -> None:
        self.ids, self.constrain = ids, constrain

    def grammar(
        self, functions: dict[str, dict[str, Any]], answer: dict[str, Any] | None, parallel: bool
    ) -> str:
        """Messages the model writes freely, then its final message (text, or ``answer``'s
        JSON) or one call (the turn ends with it, ``parallel`` or not)."""
        del parallel
        start, channel, message, end = self.ids
        typed = f'(" " <[{self.constrain}]> "json")? <[{message}]>'
        calls = " | ".join(f"{json.dumps(name)} {typed} %json {held(params)}"
                           for name, params in functions.items())  # fmt: skip
        final = "TEXT" if answer is None else f"%json {held(answer)}"
        return f"""start: thought* (<[{channel}]> "final" <[{message}]> {final} | call)
thought: <[{channel}]> ("analysis" | "commentary") <[{message}]> TEXT <[{end}]> again
again: <[{start}]> "assistant"
call: <[{channel}]> "commentary to=functions." ({calls})
TEXT: /(.|\\n)*/
"""


HERMES, JSON = CallFormat(), Json()
