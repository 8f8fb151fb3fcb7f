"""Cross-encoder graphs: a one-label sequence classifier traced to one ONNX file.

The graph takes what an embeddings graph takes (``input_ids`` and ``attention_mask``, a pair
per row as the tokenizer's pair template writes it) and returns ``embeddings`` of one column:
the sigmoid of the pair's logit, what sentence-transformers' ``CrossEncoder.predict`` answers.
A BERT-family model whose tokenizer gives segment ids (``token_type_ids``) has them made inside
the graph: 1 after the row's first separator token, as BERT's pair template sets them, so the
worker needs nothing new.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._source import read_json

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from tokenizers import Tokenizer


def separator(folder: Path, tokenizer: Tokenizer) -> int:
    """The id of the token that ends a pair's first text (``sep_token``)."""
    config = read_json(folder / "tokenizer_config.json")
    token = config.get("sep_token")
    token = token.get("content") if isinstance(token, dict) else token
    found = tokenizer.token_to_id(token) if isinstance(token, str) else None
    if found is None:
        raise BuildError("a cross-encoder's tokenizer needs its sep_token",
                         file="tokenizer_config.json", field="sep_token")  # fmt: skip
    return found


def load(folder: Path, sep: int) -> tuple[torch.nn.Module, int]:
    """The classifier wrapped as a scorer, and its position limit."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager", dtype="float32"
    )
    config = model.config
    given = AutoTokenizer.from_pretrained(str(folder), local_files_only=True).model_input_names
    segments = ("token_type_ids" in inspect.signature(model.forward).parameters
                and "token_type_ids" in given
                and int(getattr(config, "type_vocab_size", 1)) > 1)  # fmt: skip

    class Scorer(torch.nn.Module):
        """Segment ids from the separators, the classifier, then the sigmoid."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            """Score one right-padded batch of pairs."""
            extra = {}
            if segments:
                seps = (input_ids == sep).to(torch.int64)
                after = (torch.cumsum(seps, dim=1) - seps) > 0
                extra = {"token_type_ids": after.to(torch.int64) * attention_mask}
            logits = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits
            return torch.sigmoid(logits)

    return Scorer().eval(), int(config.max_position_embeddings)
