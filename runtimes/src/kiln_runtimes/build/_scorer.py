"""Sequence classifier graphs: a cross-encoder (one label) or a classifier (more) traced to one
ONNX file.

The graph takes what an embeddings graph takes (``input_ids`` and ``attention_mask``) and
returns ``embeddings``, a column per label: a cross-encoder's row is a text pair (as the
tokenizer's pair template writes it) and its column the pair's logit through the activation
its config names (a sigmoid by default), what sentence-transformers' ``CrossEncoder.predict``
answers; a classifier's row is a text and its columns the softmax of its logits (the sigmoid of
each for a multi-label one), what transformers' text-classification pipeline answers. A
BERT-family model whose tokenizer gives segment ids (``token_type_ids``) has them made inside
the graph: 1 after the row's first separator token, as BERT's pair template sets them, so the
worker needs nothing new.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kiln_runtimes.build._encoder import context
from kiln_runtimes.build._options import BuildError
from kiln_runtimes.build._source import read_json

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from tokenizers import Tokenizer


@dataclass(frozen=True, slots=True)
class Classifier:
    """The wrapped model, its position limit and its labels in column order."""

    module: torch.nn.Module
    positions: int
    labels: list[str]


def separator(folder: Path, tokenizer: Tokenizer, *, required: bool = True) -> int | None:
    """The id of the token that ends a pair's first text (``sep_token``); a classifier of
    single texts may have none."""
    config = read_json(folder / "tokenizer_config.json")
    token = config.get("sep_token")
    token = token.get("content") if isinstance(token, dict) else token
    found = tokenizer.token_to_id(token) if isinstance(token, str) else None
    if found is None and required:
        raise BuildError("a cross-encoder's tokenizer needs its sep_token",
                         file="tokenizer_config.json", field="sep_token")  # fmt: skip
    return found


def sigmoid(labels: int, problem_type: str | None) -> bool:
    """Whether the columns are each label's sigmoid (one label, or several that may all hold),
    not one softmax: the text-classification pipeline's rule."""
    return labels == 1 or problem_type == "multi_label_classification"


ACTIVATIONS = ("Sigmoid", "Identity", "Tanh")
"""The activations a cross-encoder's config may name for its score (``torch.nn``'s)."""


def activation(config: Any) -> str:
    """What ``CrossEncoder.predict`` applies to a one-label model's logit: the torch activation
    its config names (``sentence_transformers.activation_fn``, or before sentence-transformers 4
    ``sbert_ce_default_activation_function``), else a sigmoid; a path outside ``torch`` is
    untrusted code it passes over too."""
    named = (getattr(config, "sentence_transformers", None) or {}).get("activation_fn") or getattr(
        config, "sbert_ce_default_activation_function", None
    )
    if not isinstance(named, str) or not named.startswith("torch."):
        return "Sigmoid"
    if named.rsplit(".", 1)[-1] not in ACTIVATIONS:
        raise BuildError(
            f"a cross-encoder's activation must be one of {', '.join(ACTIVATIONS)}, not {named}",
            file="config.json", field="sentence_transformers.activation_fn",
        )  # fmt: skip
    return named.rsplit(".", 1)[-1]


def load(folder: Path, sep: int | None) -> Classifier:
    """The sequence classifier wrapped to answer probabilities."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    model = AutoModelForSequenceClassification.from_pretrained(
        str(folder), local_files_only=True, attn_implementation="eager", dtype="float32"
    )
    config = model.config
    hf_tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    given = hf_tokenizer.model_input_names
    pad = _pad_id(config.get_text_config(), hf_tokenizer)
    segments = (sep is not None
                and "token_type_ids" in inspect.signature(model.forward).parameters
                and "token_type_ids" in given
                and int(getattr(config, "type_vocab_size", 1)) > 1)  # fmt: skip
    each = sigmoid(int(config.num_labels), getattr(config, "problem_type", None))
    score = activation(config) if int(config.num_labels) == 1 else "Sigmoid"
    sep_id = -1 if sep is None else sep  # no token has it: no segments

    class Probabilities(torch.nn.Module):
        """Segment ids from the separators, the classifier, then sigmoid or softmax."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            """Score one right-padded batch of texts (or pairs)."""
            extra = {}
            if pad is not None:  # a decoder's head reads the last token that is not padding
                input_ids = torch.where(attention_mask.bool(), input_ids, pad)
            if segments:
                seps = (input_ids == sep_id).to(torch.int64)
                after = (torch.cumsum(seps, dim=1) - seps) > 0
                extra = {"token_type_ids": after.to(torch.int64) * attention_mask}
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, **extra)
            logits: torch.Tensor = out.logits
            if not each:
                return torch.softmax(logits, dim=-1)
            if score == "Identity":
                return logits
            return torch.tanh(logits) if score == "Tanh" else torch.sigmoid(logits)

    labels = [str(config.id2label[i]) for i in range(int(config.num_labels))]
    positions = context(folder, int(config.max_position_embeddings))
    return Classifier(Probabilities().eval(), positions, labels)


def _pad_id(text: Any, tokenizer: Any) -> int | None:
    """The id the graph writes where a row is padding. A decoder's classifier (Qwen2's, Llama's)
    scores the last token that is not ``pad_token_id``, so padding must be that token; one
    without a ``pad_token_id`` (transformers then takes the last token, one text at a time) is
    given the tokenizer's padding or end-of-text token, which texts do not end with."""
    if text.pad_token_id is None:
        fallback = tokenizer.pad_token_id
        text.pad_token_id = tokenizer.eos_token_id if fallback is None else fallback
    return None if text.pad_token_id is None else int(text.pad_token_id)
