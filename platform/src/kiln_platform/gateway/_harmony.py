"""gpt-oss's answers, in OpenAI's harmony format: messages, each a header naming its channel
(``<|channel|>analysis``, then ``<|message|>``) and a body up to ``<|end|>`` (or ``<|return|>``,
``<|call|>``). What the model writes on ``analysis`` is the message's ``reasoning``, on
``final`` (and ``commentary``, its preambles) its ``content``: vLLM's reasoning parser for
gpt-oss. The markers are special tokens: a chat's text keeps them (``skip_special_tokens`` off
for such a model) so this reads them, and they reach no client.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kiln_platform.gateway._reasoning import Split
from kiln_platform.gateway._textstream import longest_stop_prefix_suffix

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tokenizers import Tokenizer

MESSAGE = "<|message|>"
ENDS = ("<|end|>", "<|return|>", "<|call|>")
CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
RECIPIENT = re.compile(r"\bto=functions\.([\w.-]+)")


MARKS = ("<|start|>", "<|channel|>", MESSAGE, ENDS[0])


def harmony_ids(tokenizer: Tokenizer) -> tuple[int, int, int, int] | None:
    """The ids of ``<|start|>``, ``<|channel|>``, ``<|message|>`` and ``<|end|>`` if the
    tokenizer's special tokens are harmony's (gpt-oss's ``o200k_harmony``), else ``None``."""
    special = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}
    if not set(MARKS) <= special.keys():
        return None
    start, channel, message, end = (special[mark] for mark in MARKS)
    return start, channel, message, end


@dataclass(slots=True)
class Harmony(Split):
    """Feed an answer's text (its markers shown) as it comes; get the reasoning and the content
    it makes final (``Split``'s: ``state`` is ``inside`` until the ``final`` channel's message
    begins, ``after`` from then; ``reasoned`` once it wrote on ``analysis``)."""

    channel: str | None = None
    """The channel of the message being read (``None``: in a header)."""
    recipient: str | None = None
    """The function the message being read calls (``to=functions.NAME`` in its header)."""
    _body: str = ""

    @classmethod
    def opened(cls, message_id: int, prompt_ids: Sequence[int]) -> Harmony:
        """The split of an answer to ``prompt_ids``: in a header, or, if the prompt opened a
        message's body (its last token ``<|message|>``), in the final one's."""
        if prompt_ids and prompt_ids[-1] == message_id:
            return cls("after", channel="final")
        return cls("inside")

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) made final by ``text``."""
        self._held += text
        reasoning = content = ""
        while True:
            if self.channel is None:  # a header: its channel, up to the body
                bare = self._held.lstrip()
                if bare and not "<|".startswith(bare[:2]):  # no header: the answer's words
                    self.channel, self.state = "final", "after"
                    continue
                at = self._held.find(MESSAGE)
                if at < 0:
                    return reasoning, content
                named, to = CHANNEL.search(self._held[:at]), RECIPIENT.search(self._held[:at])
                self.channel = named.group(1) if named else "final"
                self.recipient = to.group(1) if to else None
                self._held = self._held[at + len(MESSAGE) :]
                if self.channel == "analysis":
                    self.reasoned = True
                elif self.state == "inside":
                    self.state = "after"
                continue
            ends = [i for i in (self._held.find(end) for end in ENDS) if i >= 0]
            cut = min(ends) if ends else len(self._held) - longest_stop_prefix_suffix(
                self._held, (*ENDS, "<|start|>", "<|channel|>"))  # fmt: skip
            said, self._held = self._held[:cut], self._held[cut:]
            if self.recipient is not None:  # a call: whole, once it ends
                self._body += said
            elif self.channel == "analysis":
                reasoning += said
            else:
                content += said
            if not ends:
                return reasoning, content
            self._held = self._held[len(next(e for e in ENDS if self._held.startswith(e))) :]
            content += self._called()
            self.channel = None

    def flush(self) -> tuple[str, str]:
        """(reasoning, content) still held back, at the end of the answer: a body's last
        characters (a header's are dropped)."""
        held, self._held = self._held, ""
        if self.channel is None:
            return "", ""
        if self.recipient is not None:  # ended by ``<|call|>``, a stop token
            self._body += held
            return "", self._called()
        return (held, "") if self.channel == "analysis" else ("", held)

    def _called(self) -> str:
        """The call message just read, as a Hermes block (``_call_formats.HarmonyCalls``
        reads it; none if the message was no call)."""
        if self.recipient is None:
            return ""
        body, name, self._body, self.recipient = self._body.strip(), self.recipient, "", None
        called = f'{{"name": {json.dumps(name)}, "arguments": {body or "{}"}}}'
        return f"<tool_call>\n{called}\n</tool_call>"

    def whole(self, text: str) -> tuple[str, str]:
        """A whole answer's (reasoning, content)."""
        (reasoning, content), rest = self.push(text), self.flush()
        return reasoning + rest[0], content + rest[1]


def analysis_tokens(
    tokens: Sequence[int], ids: tuple[int, int, int, int], tokenizer: Tokenizer
) -> tuple[int, bool]:
    """How many of an answer's tokens (so far) were its analysis messages, their headers and
    markers included (those before its first message on another channel; all if it wrote
    none yet, after analysis), and whether no later token can change the count."""
    _, channel, message, _ = ids
    opened, began, analysed = 0, -1, False
    for i, token in enumerate(tokens):
        if token == channel:
            began = i
        elif token == message and began >= 0:
            if not tokenizer.decode(list(tokens[began + 1 : i])).strip().startswith("analysis"):
                return opened, True
            analysed = True
        elif token not in ids and began < 0 and not analysed:
            return 0, True  # words before any header: no analysis
        if token == ids[3]:  # ``<|end|>``: the next message's header begins after it
            opened, began = i + 1, -1
    return (len(tokens) if analysed else 0), False
