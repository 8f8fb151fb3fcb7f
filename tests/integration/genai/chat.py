"""What the GenAI integration tests share: a backend started on a built folder, and the prompt
as the gateway makes it (the chat template through jinja2, then ``tokenizers``)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import msgspec
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kiln_runtimes.protocol import MANIFEST_NAME, ModelManifest

if TYPE_CHECKING:
    from pathlib import Path

    from kiln_runtimes.backends.base import EngineOptions
    from kiln_runtimes.backends.genai import GenAIGenerationBackend


async def start_backend(folder: Path, options: EngineOptions) -> GenAIGenerationBackend:
    """Kiln's GenAI backend on ``folder``, loaded as a worker loads it (``unload()`` it after)."""
    pytest.importorskip("onnxruntime")
    from kiln_runtimes import backends
    from kiln_runtimes.backends.genai import GenAIGenerationBackend

    manifest = msgspec.json.decode((folder / MANIFEST_NAME).read_bytes(), type=ModelManifest)
    generation = GenAIGenerationBackend(options)
    await backends.start(generation, folder, manifest, None)
    return generation


class ChatPrompt:
    """What the gateway does: chat template (jinja2), then ``tokenizers`` without special tokens;
    ``system``: a system message before every question."""

    def __init__(self, folder: Path, system: str | None = None) -> None:
        from tokenizers import Tokenizer

        config = json.loads((folder / "tokenizer_config.json").read_text())
        self.template = ImmutableSandboxedEnvironment().from_string(config["chat_template"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.system = system

    def ids(self, question: str) -> list[int]:
        messages = [{"role": "user", "content": question}]
        if self.system is not None:
            messages.insert(0, {"role": "system", "content": self.system})
        text = self.template.render(messages=messages, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def text(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))
