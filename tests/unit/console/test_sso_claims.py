"""Which ID-token claims vouch for an email (``KILN_OIDC_REQUIRE_VERIFIED_EMAIL``)."""

from __future__ import annotations

from typing import Any

import pytest

from kiln_console.sso import vouched_email
from kiln_platform.errors import Forbidden


@pytest.mark.parametrize(
    ("claims", "required", "ok"),
    [
        ({"email": "a@x.test", "email_verified": True}, True, True),
        ({"email": "a@x.test"}, True, False),
        ({"email": "a@x.test"}, False, True),  # a provider that never says (Azure AD)
        ({"email": "a@x.test", "email_verified": False}, False, False),
        ({"email": "a@x.test", "email_verified": "true"}, True, False),  # not a boolean
        ({"email_verified": True}, True, False),
        ({"email": "", "email_verified": True}, False, False),
    ],
)
def test_an_email_is_vouched_for(claims: dict[str, Any], required: bool, ok: bool) -> None:
    if ok:
        assert vouched_email(claims, require_verified=required) == claims["email"]
    else:
        with pytest.raises(Forbidden):
            vouched_email(claims, require_verified=required)
