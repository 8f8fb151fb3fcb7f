"""The SSRF guard's decisions: public addresses pass, the rest only inside allowed networks."""

from __future__ import annotations

import ipaddress

import pytest

from kiln_platform.webhooks.guard import Refused, allowed, networks, parse, screen

REFUSED = ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.0.1", "169.254.169.254", "::1",
           "fe80::1", "fc00::1", "224.0.0.1", "0.0.0.0", "100.64.0.1", "::ffff:127.0.0.1",  # noqa: S104
           "240.0.0.1", "ff02::1", "2002:7f00:1::", "64:ff9b::a00:1",
           "2001:0:4136:e378:8000:63bf:f5ff:fffe"]  # fmt: skip


@pytest.mark.parametrize("address", REFUSED)
def test_non_public_addresses_are_refused_by_default(address: str) -> None:
    assert not allowed(ipaddress.ip_address(address), ())


def test_public_addresses_pass_and_allowed_networks_open_the_rest() -> None:
    assert allowed(ipaddress.ip_address("93.184.216.34"), ())
    assert allowed(ipaddress.ip_address("2606:4700::1111"), ())
    allow = networks("127.0.0.0/8, 10.0.0.0/8")
    assert allowed(ipaddress.ip_address("127.0.0.2"), allow)
    assert allowed(ipaddress.ip_address("::ffff:10.0.0.1"), allow)
    assert not allowed(ipaddress.ip_address("192.168.0.1"), allow)


def test_bad_networks_and_urls_are_named() -> None:
    with pytest.raises(ValueError, match="nope"):
        networks("nope")
    for url in ("ftp://example.com/", "http:///x", "http://u:p@example.com/", "http://h:x/"):
        with pytest.raises(Refused):
            parse(url)
    assert parse("https://example.com/hook") == ("example.com", 443)


async def test_a_name_resolving_to_loopback_is_refused() -> None:
    with pytest.raises(Refused, match="localhost"):
        await screen("http://localhost:9/hook", ())
    await screen("http://localhost:9/hook", networks("127.0.0.0/8,::1/128"))
