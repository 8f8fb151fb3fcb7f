"""A tenant's name is shown in the console, logs and CSV exports: printable characters only,
no blank at either end (the API's 400 and the CLI's error both come from the type)."""

from __future__ import annotations

import msgspec
import pytest

from kiln_platform.tenants.schemas import TenantCreate, TenantUpdate


@pytest.mark.parametrize("name", ["acme", "a", "Acme Corp.", "Café 東京", "x" * 100])
def test_printable_names_are_taken(name: str) -> None:
    assert msgspec.convert({"name": name}, TenantCreate).name == name
    assert msgspec.convert({"name": name}, TenantUpdate).name == name


@pytest.mark.parametrize(
    "name", ["", " acme", "acme ", "ac\tme", "ac\nme", "ac\x1b[31mme", "acme\x7f", "x" * 101]
)
def test_control_characters_and_outer_blanks_are_refused(name: str) -> None:
    with pytest.raises(msgspec.ValidationError, match=r"\$\.name"):
        msgspec.convert({"name": name}, TenantCreate)
