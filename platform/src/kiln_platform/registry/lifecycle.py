"""Version lifecycle and addressing, as pure functions over the catalog.

A version moves staging -> active -> deprecated -> retired. A deprecated version still answers,
with ``Deprecation`` (RFC 9745) and ``Sunset`` (RFC 8594) headers; a retired one is ``410 Gone``
naming its successor. Clients address ``model``, ``model@3`` (a version), ``model@stable``,
``model@canary`` (the route's) or ``model@prod`` (an alias, ``registry.aliases``).
"""

from __future__ import annotations

from email.utils import format_datetime
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from kiln_platform.errors import BadRequest, Gone

if TYPE_CHECKING:
    from datetime import datetime


class Release(Protocol):
    """What lifecycle reads of a version (``registry.services.ResolvedVersion``)."""

    @property
    def model(self) -> str: ...
    @property
    def version(self) -> str: ...
    @property
    def pool(self) -> str: ...
    @property
    def artifact_digest(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def deprecated_at(self) -> datetime | None: ...
    @property
    def sunset(self) -> datetime | None: ...
    @property
    def successor(self) -> str | None: ...


R = TypeVar("R", bound=Release)

State = Literal["staging", "active", "deprecated", "retired"]
STATES: tuple[State, ...] = ("staging", "active", "deprecated", "retired")
DEFAULT_SERVING = frozenset({"active", "deprecated"})
"""States a model's default (no ``@``) may resolve to when it has no route."""
ROUTE_ALIASES = frozenset({"stable", "canary"})
VERSION_HEADER = "x-kiln-model-version"


def address(model: str) -> tuple[str, str | None]:
    """``name@suffix`` -> (name, suffix); a plain name has no suffix."""
    name, sep, suffix = model.partition("@")
    if sep and not suffix:
        raise BadRequest(f"`{model}` names no version or alias after `@`.", param="model")
    return name, suffix if sep else None


def refuse_retired(version: R) -> R:
    """``version`` unless it is retired (``410``, naming its successor)."""
    if version.state != "retired":
        return version
    successor = f"; use `{version.model}@{version.successor}`" if version.successor else ""
    raise Gone(f"The model `{version.pool}` is retired{successor}.", param="model")


def check_target(state: str, version: str, param: str) -> None:
    """Routing, aliasing or pinning to a retired version is refused (400 naming the field)."""
    if state == "retired":
        raise BadRequest(f"Version `{version}` is retired and cannot be routed to.", param=param)


def fingerprint(version: Release) -> str:
    """OpenAI's ``system_fingerprint``: the version and its engine's build digest."""
    digest = version.artifact_digest.partition(":")[2] or version.artifact_digest
    return f"kiln-{version.version}-{digest[:12]}"


def _http_date(when: datetime) -> str:
    return format_datetime(when, usegmt=True)


def headers(version: Release) -> dict[str, str]:
    """The echo of the version that answered, plus deprecation notices."""
    found = {VERSION_HEADER: version.version}
    if version.state == "deprecated":
        since = version.deprecated_at
        found["deprecation"] = f"@{int(since.timestamp())}" if since else "@0"
        if version.sunset is not None:
            found["sunset"] = _http_date(version.sunset)
        if version.successor:
            found["link"] = (
                f'</v1/models/{version.model}@{version.successor}>; rel="successor-version"'
            )
    return found
