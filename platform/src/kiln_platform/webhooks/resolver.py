"""The resolver webhook deliveries connect through: aiohttp's, checked by the SSRF guard."""

from __future__ import annotations

import ipaddress
import socket

from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver

from kiln_platform.webhooks.guard import Network, allowed


class GuardedResolver(AbstractResolver):
    """aiohttp's resolver, refusing a host with any address the guard does not allow: what
    the delivery connects to is what was checked."""

    def __init__(self, allow: tuple[Network, ...]) -> None:
        self._allow = allow
        self._inner = DefaultResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """The inner resolver's answer, if every address in it is allowed."""
        found = await self._inner.resolve(host, port, family)
        for item in found:
            if not allowed(ipaddress.ip_address(item["host"]), self._allow):
                raise OSError(f"refused: {host} resolves to {item['host']}")
        return found

    async def close(self) -> None:
        """Close the inner resolver."""
        await self._inner.close()
