"""Nodes Kiln's mends write into the builder's graph by hand, from tables whose inputs name
other nodes of the table as ``:X`` (node ``X``'s output under the same prefix)."""

from __future__ import annotations

from typing import Any


def make_labelled(
    model: Any, name: str, label: str, op: str, inputs: list[str], *, dtype: Any,
    dims: list[Any], **attrs: Any,
) -> str:  # fmt: skip
    """Node ``op`` named ``{name}/{label}`` on ``inputs`` (``:X``: node ``{name}/X``'s output),
    its output typed ``dtype`` and shaped ``dims``; returns the output's name."""
    named = [f"{name}/{i[1:]}/output_0" if i.startswith(":") else i for i in inputs]
    output = f"{name}/{label}/output_0"
    model.make_node(op, named, [output], name=f"{name}/{label}", **attrs)
    model.make_value(output, dtype, dims)
    return output
