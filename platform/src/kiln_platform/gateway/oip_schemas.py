"""Open Inference Protocol v2 (REST) request and response shapes (msgspec)."""

from __future__ import annotations

from typing import Any

import msgspec


class InferInput(msgspec.Struct, kw_only=True):
    """An input tensor: JSON ``data``, or ``parameters.binary_data_size`` bytes after the header."""

    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class RequestedOutput(msgspec.Struct, kw_only=True):
    """An output the client wants, optionally as binary (``parameters.binary_data``)."""

    name: str
    parameters: dict[str, Any] | None = None


class InferRequestBody(msgspec.Struct, kw_only=True):
    """``POST /v2/models/{name}[/versions/{v}]/infer``."""

    inputs: list[InferInput]
    id: str | None = None
    parameters: dict[str, Any] | None = None
    outputs: list[RequestedOutput] | None = None


class InferOutput(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One output tensor in the response."""

    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] | None = None
    data: list[Any] | None = None


class InferResponseBody(msgspec.Struct, kw_only=True, omit_defaults=True):
    """The inference response header (followed by binary outputs, if any)."""

    model_name: str
    model_version: str
    outputs: list[InferOutput]
    id: str | None = None


class MetadataTensor(msgspec.Struct, kw_only=True):
    """A tensor in model metadata (``-1`` for a dynamic dimension)."""

    name: str
    datatype: str
    shape: list[int]


class ModelMetadata(msgspec.Struct, kw_only=True):
    """``GET /v2/models/{name}[/versions/{v}]``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[MetadataTensor]
    outputs: list[MetadataTensor]


class ServerMetadata(msgspec.Struct, kw_only=True):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]
