"""A reasoning model's answer split into its reasoning and its content (the fields vLLM's
reasoning parsers fill): what it writes between ``<think>`` and ``</think>`` is the message's
``reasoning``, the rest its ``content`` (or its tool calls).

A model reasons this way when its tokenizer has both tags as tokens of their own that its text
shows (not special tokens, which detokenizing leaves out). Its answer starts inside the
reasoning when the prompt left a ``<think>`` open (DeepSeek-R1's template, Qwen3's thinking
ones), else only if it opens one itself, before any other text (Qwen3's; with
``enable_thinking: false`` its template closes an empty one in the prompt, so all is content).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

from kiln_platform.gateway._textstream import longest_stop_prefix_suffix

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tokenizers import Tokenizer

OPEN, CLOSE = "<think>", "</think>"
TAGS = ((OPEN, CLOSE), ("<seed:think>", "</seed:think>"))
"""The reasoning tags read: most models', and Seed-OSS's."""


class Think(NamedTuple):
    """A reasoning model's tags: their ids, and their text."""

    open_id: int
    close_id: int
    open: str = OPEN
    close: str = CLOSE


def think_ids(tokenizer: Tokenizer) -> Think | None:
    """The reasoning tags (``TAGS``) the tokenizer has both of as added tokens its text shows
    (``None``: the model does not reason in tags)."""
    shown = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if not t.special}
    return next((Think(shown[o], shown[c], o, c) for o, c in TAGS if o in shown and c in shown),
                None)  # fmt: skip


def _last(ids: Sequence[int], token: int) -> int:
    return max((i for i, t in enumerate(ids) if t == token), default=-1)


@dataclass(slots=True)
class Split:
    """Feed an answer's text as it comes; get the reasoning and the content it makes final
    (text that may still be a tag is held back)."""

    state: Literal["start", "inside", "after"] = "start"
    reasoned: bool = False
    """Whether the answer began inside the reasoning or opened it."""
    _held: str = ""
    tags: tuple[str, str] = (OPEN, CLOSE)

    @classmethod
    def after(cls, think: Think, prompt_ids: Sequence[int]) -> Split:
        """The split of an answer to ``prompt_ids`` (inside the reasoning if it left one open)."""
        opened = _last(prompt_ids, think.open_id) > _last(prompt_ids, think.close_id)
        tags = (think.open, think.close)
        return cls("inside", reasoned=True, tags=tags) if opened else cls(tags=tags)

    def push(self, text: str) -> tuple[str, str]:
        """(reasoning, content) made final by ``text``."""
        self._held += text
        (opening, closing), reasoning, content = self.tags, "", ""
        while True:
            if self.state == "start":
                bare = self._held.lstrip()
                if bare.startswith(opening):
                    self._held, self.state, self.reasoned = bare[len(opening) :], "inside", True
                elif opening.startswith(bare):  # nothing yet, or the start of the tag
                    return reasoning, content
                else:
                    self.state = "after"
            elif self.state == "inside":
                at = self._held.find(closing)
                if at < 0:
                    cut = len(self._held) - longest_stop_prefix_suffix(self._held, (closing,))
                    reasoning, self._held = reasoning + self._held[:cut], self._held[cut:]
                    return reasoning, content
                reasoning += self._held[:at]
                self._held, self.state = self._held[at + len(closing) :], "after"
            else:
                content, self._held = content + self._held, ""
                return reasoning, content

    def flush(self) -> tuple[str, str]:
        """(reasoning, content) still held back, at the end of the answer."""
        held, self._held = self._held, ""
        return (held, "") if self.state == "inside" else ("", held)

    def whole(self, text: str) -> tuple[str, str]:
        """A whole answer's (reasoning, content)."""
        (reasoning, content), rest = self.push(text), self.flush()
        return reasoning + rest[0], content + rest[1]


def reasoning_tokens(
    think: Think, prompt: Sequence[int], answer: Sequence[int], tokenizer: Tokenizer
) -> int:
    """How many of an answer's tokens (so far) were its reasoning, tags included, as ``Split``
    splits its text: to the first ``</think>`` (all if it never closed) if the prompt left
    ``<think>`` open or the answer opens it after nothing but blank space; else none."""
    if Split.after(think, prompt).state != "inside":
        at = next((i for i, t in enumerate(answer) if t == think.open_id), None)
        if at is None or tokenizer.decode(list(answer[:at])).strip():
            return 0
    return next((i + 1 for i, t in enumerate(answer) if t == think.close_id), len(answer))
