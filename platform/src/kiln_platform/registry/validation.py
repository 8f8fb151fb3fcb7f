"""Validating an uploaded ONNX model: archive safety, ONNX checker, opset range, external data.

Every rejection is a ``BadRequest`` that says why. Nothing here touches the store or the database.
"""

from __future__ import annotations

import stat
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from kiln_platform.errors import BadRequest
from kiln_runtimes.protocol import TensorSpec

if TYPE_CHECKING:
    from collections.abc import Iterator

    import onnx

_DATATYPES = {
    1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64",
    8: "BYTES", 9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64",
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class CheckedModel:
    """What validation learned: where the graph is and what it takes and returns."""

    model_file: str
    opset: int
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batching: bool


def _member(name: str) -> PurePosixPath:
    """An archive member's relative path, or ``BadRequest`` if it could escape the folder."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts or ":" in path.parts[0]:
        raise BadRequest(f"archive member {name!r} has an unsafe path")
    return path


def unpack(upload: Path, dest: Path, max_bytes: int) -> None:
    """Unpack a .zip/.tar upload into ``dest``, or place a bare file there as ``model.onnx``."""
    dest.mkdir(parents=True, exist_ok=True)
    with upload.open("rb") as f:
        head = f.read(4)
    if head == b"PK\x03\x04":
        _unzip(upload, dest, max_bytes)
    elif tarfile.is_tarfile(upload):
        _untar(upload, dest, max_bytes)
    else:
        upload.replace(dest / "model.onnx")


def _unzip(upload: Path, dest: Path, max_bytes: int) -> None:
    with zipfile.ZipFile(upload) as archive:
        members = [m for m in archive.infolist() if not m.is_dir()]
        for m in members:
            _member(m.filename)
            if stat.S_ISLNK(m.external_attr >> 16):
                raise BadRequest(f"archive member {m.filename!r} is a symbolic link")
        if sum(m.file_size for m in members) > max_bytes:
            raise BadRequest(f"the unpacked model exceeds the {max_bytes}-byte limit")
        for m in members:
            target = dest / _member(m.filename)
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(m) as src, target.open("wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)


def _untar(upload: Path, dest: Path, max_bytes: int) -> None:
    with tarfile.open(upload) as archive:
        members = archive.getmembers()
        for m in members:
            _member(m.name)
            if not (m.isfile() or m.isdir()):
                raise BadRequest(f"archive member {m.name!r} is not a regular file")
        if sum(m.size for m in members if m.isfile()) > max_bytes:
            raise BadRequest(f"the unpacked model exceeds the {max_bytes}-byte limit")
        archive.extractall(dest, members=[m for m in members if m.isfile()], filter="data")


def inspect(folder: Path, min_opset: int, max_opset: int) -> CheckedModel:
    """Check the one ``.onnx`` file under ``folder``; returns its specs."""
    import onnx

    found = sorted(p for p in folder.rglob("*.onnx") if p.is_file())
    if len(found) != 1:
        names = [p.relative_to(folder).as_posix() for p in found]
        raise BadRequest(f"the upload must hold exactly one .onnx file; found {names or 'none'}")
    path = found[0]
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf decoding errors have no common base class
        raise BadRequest(f"not a valid ONNX model: {exc}") from None
    opset = _opset(model, min_opset, max_opset)
    _check_external_data(model, path.parent, folder)
    try:
        onnx.checker.check_model(str(path))
    except Exception as exc:  # onnx raises ValidationError and, for broken files, others
        raise BadRequest(f"the ONNX checker rejected the model: {exc}") from None
    initializers = {t.name for t in model.graph.initializer}
    inputs = [_spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [_spec(v) for v in model.graph.output]
    if not inputs or not outputs:
        raise BadRequest("the model must have at least one input and one output")
    batching = all(s.shape and s.shape[0] < 0 for s in [*inputs, *outputs])
    return CheckedModel(path.relative_to(folder).as_posix(), opset, inputs, outputs, batching)


def _opset(model: onnx.ModelProto, low: int, high: int) -> int:
    if not model.graph.node and not model.graph.output:
        raise BadRequest("not a valid ONNX model: it has no graph")
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not versions:
        raise BadRequest("the model declares no ai.onnx opset")
    if not low <= versions[0] <= high:
        raise BadRequest(f"opset {versions[0]} is outside the supported range {low}..{high}")
    return int(versions[0])


def _tensors(graph: onnx.GraphProto) -> Iterator[onnx.TensorProto]:
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield sparse.values
        yield sparse.indices
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from _tensors(attr.g)
            for sub in attr.graphs:
                yield from _tensors(sub)


def _check_external_data(model: onnx.ModelProto, base: Path, root: Path) -> None:
    """Every external-data file must be a regular file inside the upload, big enough."""
    top = root.resolve()
    for tensor in _tensors(model.graph):
        if tensor.data_location != 1:  # TensorProto.EXTERNAL
            continue
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        if not location or Path(location).is_absolute() or ".." in PurePosixPath(location).parts:
            raise BadRequest(
                f"tensor {tensor.name!r}: external data {location!r} is outside the model folder"
            )
        target = base / location
        if target.is_symlink() or not target.resolve().is_relative_to(top):
            raise BadRequest(
                f"tensor {tensor.name!r}: external data {location!r} is outside the model folder"
            )
        if not target.is_file():
            raise BadRequest(f"tensor {tensor.name!r}: external data file {location!r} is missing")
        end = int(info.get("offset", 0) or 0) + int(info.get("length", 0) or 0)
        if end > target.stat().st_size:
            raise BadRequest(
                f"tensor {tensor.name!r}: external data runs past the end of {location!r}"
            )


def _spec(value: onnx.ValueInfoProto) -> TensorSpec:
    import onnx

    kind = value.type.WhichOneof("value")
    if kind != "tensor_type":
        hint = ""
        if kind == "sequence_type":  # skl2onnx's classifiers: probabilities as a ZipMap
            hint = " (a scikit-learn classifier? convert it with options={'zipmap': False})"
        raise BadRequest(
            f"{value.name!r} is a {kind.removesuffix('_type')}, not a tensor; only tensors "
            f"are served{hint}"
        )
    tensor = value.type.tensor_type
    datatype = _DATATYPES.get(tensor.elem_type)
    if datatype is None:
        name = onnx.TensorProto.DataType.Name(tensor.elem_type)
        raise BadRequest(
            f"{value.name!r} has element type {name}; served tensors are "
            f"{', '.join(_DATATYPES.values())}"
        )
    dims = list(tensor.shape.dim)
    shape = [d.dim_value if d.HasField("dim_value") else -1 for d in dims]
    names = [d.dim_param if d.HasField("dim_param") else None for d in dims]
    return TensorSpec(name=value.name, datatype=datatype, shape=shape, dim_names=names)
