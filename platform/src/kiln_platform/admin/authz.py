"""Roles, actors and the tenant scoping every admin service applies.

A caller of ``/admin/v1`` is an ``Actor``: a console user (its role), an API key or an OAuth
client (the key's ``role`` column, bounded by its scopes), or the CLI (platform-admin).

| role | tenants it sees | may change |
|---|---|---|
| platform-admin | all | everything (alone: the model catalog, shadows, compile jobs) |
| tenant-admin | its own | its tenant's keys, OAuth clients, adapters, users (tenant roles) |
| tenant-member | its own | nothing (reads its tenant, keys, quotas) |
| finance | all (or its own, if it has a tenant) | nothing (reads costs, statements, prices) |

Finance reads nothing else, and may not call ``/v1`` or ``/v2`` (``gateway.auth``).

Objects of a tenant the actor cannot see are ``NotFound`` — indistinguishable from absent ones.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Literal

from kiln_platform.errors import Forbidden, NotFound


class Role(StrEnum):
    """The four roles."""

    PLATFORM_ADMIN = "platform-admin"
    TENANT_ADMIN = "tenant-admin"
    TENANT_MEMBER = "tenant-member"
    FINANCE = "finance"


RoleName = Literal["platform-admin", "tenant-admin", "tenant-member", "finance"]
"""A role's name on the wire (``Role``'s values)."""

GLOBAL_ROLES = frozenset({Role.PLATFORM_ADMIN, Role.FINANCE})
TENANT_ROLES = frozenset({Role.TENANT_ADMIN, Role.TENANT_MEMBER})
ALL_SCOPES = frozenset({"inference", "admin:read", "admin:write"})

NOT_FINANCE = frozenset(Role) - {Role.FINANCE}
BILLING_READERS = frozenset({Role.PLATFORM_ADMIN, Role.FINANCE, Role.TENANT_ADMIN})
PLATFORM = frozenset({Role.PLATFORM_ADMIN})

# resource -> (roles that may read, roles that may write)
_RULES: dict[str, tuple[frozenset[Role], frozenset[Role]]] = {
    "tenants": (NOT_FINANCE, PLATFORM),
    "keys": (
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN, Role.TENANT_MEMBER}),
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN}),
    ),
    "oauth-clients": (
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN, Role.TENANT_MEMBER}),
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN}),
    ),
    "adapters": (
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN, Role.TENANT_MEMBER}),
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN}),
    ),
    "users": (
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN}),
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN}),
    ),
    "quotas": (NOT_FINANCE, PLATFORM),
    # The catalog serves every tenant: only a platform-admin changes it (versions, routes).
    "models": (NOT_FINANCE, PLATFORM),
    "compile-jobs": (PLATFORM, PLATFORM),
    "model-shadows": (PLATFORM, PLATFORM),  # a shadow's report spans every tenant's requests
    "model-pins": (PLATFORM, PLATFORM),  # which tenants an operator pinned: not one tenant's
    "model-rollouts": (PLATFORM, PLATFORM),  # canary rollouts: their figures span every tenant
    "signing-keys": (PLATFORM, PLATFORM),  # OAuth token signing keys (``kiln oauth rotate-keys``)
    "audit": (frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN}), frozenset()),
    # What finance may read, and all it may read: costs, statements, adjustments, prices.
    "reports": (BILLING_READERS, frozenset()),
    "statements": (BILLING_READERS, PLATFORM),
    "adjustments": (BILLING_READERS, PLATFORM),
    "price-books": (frozenset(Role), PLATFORM),
    "slos": (PLATFORM, PLATFORM),  # objectives of shared models, and how every tenant fares
    "alerts": (PLATFORM, frozenset()),
    "alert-receivers": (PLATFORM, PLATFORM),  # webhooks; their signing keys sealed at rest
    "webhooks": (  # a tenant's outbound webhooks: their secrets are shown only on a write
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN, Role.TENANT_MEMBER}),
        frozenset({Role.PLATFORM_ADMIN, Role.TENANT_ADMIN}),
    ),
    # Stored chat completions and responses (prompts and answers): the tenant's own people
    # read them, its admins delete them; an operator does neither.
    "logs": (frozenset({Role.TENANT_ADMIN, Role.TENANT_MEMBER}), frozenset({Role.TENANT_ADMIN})),
    # The console's landing page: a tenant's usage and limits, or (platform-admin) the fleet.
    "overview": (NOT_FINANCE, frozenset()),
}


@dataclass(frozen=True, slots=True)
class Actor:
    """Who performs an admin action, and from where (for the audit log)."""

    name: str
    """``key:<prefix>``, ``user:<email>``, ``oauth:<client id>`` or ``cli:<login>``."""
    role: Role
    tenant_id: uuid.UUID | None
    """The tenant the actor is confined to; None for platform-wide roles."""
    scopes: frozenset[str] = field(default=ALL_SCOPES)
    request_id: str | None = None
    source: str | None = None

    @property
    def is_global(self) -> bool:
        """Sees every tenant."""
        return self.tenant_id is None


def actor_tenant(role: Role, tenant_id: uuid.UUID | None) -> uuid.UUID | None:
    """The confinement of a credential: platform-admins see all tenants, others their own
    (a finance user without a tenant sees all; a finance key, which has one, sees its own)."""
    return None if role is Role.PLATFORM_ADMIN else tenant_id


def require(actor: Actor, resource: str, *, write: bool = False) -> None:
    """Raise ``Forbidden`` unless the actor's role and scopes allow this kind of access."""
    readers, writers = _RULES[resource]
    scope = "admin:write" if write else "admin:read"
    if scope not in actor.scopes and "admin:write" not in actor.scopes:
        raise Forbidden(f"This credential does not have the '{scope}' scope.")
    if actor.role not in (writers if write else readers):
        verb = "change" if write else "read"
        raise Forbidden(f"The role '{actor.role}' may not {verb} {resource}.")


def check_tenant(actor: Actor, tenant_id: uuid.UUID | None, what: str = "object") -> None:
    """Raise ``NotFound`` (never ``Forbidden``: no existence leak) for another tenant's object."""
    if actor.tenant_id is not None and tenant_id != actor.tenant_id:
        raise NotFound(f"No such {what}.")


def grantable(actor: Actor, role: Role) -> None:
    """A tenant-admin may hand out tenant roles only."""
    if actor.role is not Role.PLATFORM_ADMIN and role not in TENANT_ROLES:
        raise Forbidden(f"The role '{actor.role}' may not grant '{role}'.")
