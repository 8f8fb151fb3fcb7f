"""The SSRF guard: a webhook may target only public addresses, unless the operator allows a
network (``KILN_WEBHOOK_ALLOW_NETWORKS``). Checked at registration, again before every
delivery, and by the resolver the delivery connects through (``resolver``, so DNS cannot change
in between). No aiohttp here: the settings check ``networks`` in every process.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from kiln_platform.errors import BadRequest

if TYPE_CHECKING:
    from collections.abc import Iterable

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class Refused(BadRequest):
    """A webhook URL the guard refuses (400 at registration; a ``refused`` attempt later)."""


def networks(value: str) -> tuple[Network, ...]:
    """The allowed networks of ``KILN_WEBHOOK_ALLOW_NETWORKS`` (``ValueError`` names a bad one)."""
    return tuple(ipaddress.ip_network(part.strip()) for part in value.split(",") if part.strip())


NAT64 = ipaddress.ip_network("64:ff9b::/96")


def embedded(address: Address) -> Address:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64), else itself."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def allowed(address: Address, allow: Iterable[Network]) -> bool:
    """Public (globally routable, not multicast), or inside a network the operator allows."""
    if any(address in net for net in allow):
        return True
    inner = embedded(address)
    if inner != address and any(inner in net for net in allow):
        return True
    return all(a.is_global and not a.is_multicast for a in {address, inner})


def parse(url: str) -> tuple[str, int]:
    """The host and port of an ``http(s)`` URL without credentials, or ``Refused``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Refused("A webhook URL must be http:// or https:// with a host.")
    if parts.username or parts.password:
        raise Refused("A webhook URL may not carry credentials.")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise Refused("The webhook URL's port is not a number.") from None
    return parts.hostname, port


async def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to (an IP literal: itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise Refused(f"The webhook host '{host}' does not resolve: {exc}.") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]


async def screen(url: str, allow: tuple[Network, ...]) -> None:
    """Refuse ``url`` unless every address its host resolves to is allowed."""
    host, port = parse(url)
    for address in await resolve(host, port):
        if not allowed(address, allow):
            raise Refused(
                f"The webhook host '{host}' resolves to {address}, a private, loopback, "
                "link-local, multicast or reserved address; an operator may allow its network "
                "with KILN_WEBHOOK_ALLOW_NETWORKS."
            )
