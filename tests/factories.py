"""Factories for platform tests: tenants, keys and model versions, written once.

Each takes the session (or database) it works in and returns what the tests go on to use.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import llguidance
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from kiln_platform.admin.authz import Actor, Role
from kiln_platform.keys import services as key_services
from kiln_platform.keys.schemas import KeyCreate
from kiln_platform.registry.services import ResolvedVersion
from kiln_platform.tenants import services as tenant_services
from kiln_platform.tenants.schemas import TenantCreate
from kiln_runtimes.protocol import ModelManifest

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.ext.asyncio import AsyncSession

    from kiln_platform.admin.authz import RoleName
    from kiln_platform.keys.schemas import KeyCreated, Scope


def resolved_version(model: str, version: str = "1") -> ResolvedVersion:
    """A resolved version of ``model`` for code that only reads its name and version (pricing)."""
    manifest = ModelManifest(name=model, task="generate", engine="onnxruntime")
    return ResolvedVersion(
        model=model,
        version=version,
        artifact_digest="sha256:" + "0" * 64,
        manifest=manifest,
        created_at=datetime(2020, 1, 1, tzinfo=UTC),
    )


CLI = Actor("cli:test", Role.PLATFORM_ADMIN, None)
"""The actor ``kiln`` commands run as: what tests seed the platform with."""

ROOT_SCOPES: tuple[Scope, ...] = ("admin:read", "admin:write", "inference")


async def make_tenant(
    session: AsyncSession, name: str | None = None, *, actor: Actor = CLI
) -> uuid.UUID:
    """A tenant created through the service (audited), named ``t-<uuid>`` unless ``name``."""
    made = await tenant_services.create_tenant(
        session, actor, TenantCreate(name=name or f"t-{uuid.uuid4()}")
    )
    return made.id


async def make_key(
    session: AsyncSession,
    hmac_key: bytes,
    tenant_id: uuid.UUID,
    scopes: Sequence[Scope] = ("inference",),
    *,
    role: RoleName | None = None,
    name: str = "k",
    actor: Actor = CLI,
) -> KeyCreated:
    """An API key created through the service; the secret is in the result."""
    data = KeyCreate(name=name, scopes=list(scopes), role=role)
    return await key_services.create_key(session, actor, tenant_id, data, hmac_key)


async def make_root_key(
    session: AsyncSession, hmac_key: bytes, *, tenant: str | None = None, actor: Actor = CLI
) -> KeyCreated:
    """A platform-admin key with every scope, in a new operators' tenant (``op-<uuid>``)."""
    op = await make_tenant(session, tenant or f"op-{uuid.uuid4()}", actor=actor)
    return await make_key(
        session, hmac_key, op, ROOT_SCOPES, role="platform-admin", name="root", actor=actor
    )


def byte_bpe(texts: Sequence[str], vocab_size: int = 400) -> Tokenizer:
    """A small byte-level BPE trained on ``texts`` (token 0 is ``<eos>``): it writes any byte
    string, as a model's tokenizer does, for grammar tests."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    return tok


def accepts(tok: Tokenizer, grammar: str, text: str) -> bool:
    """Whether ``text``, in ``tok``'s tokens (a ``byte_bpe``), is a whole answer ``grammar``
    (llguidance's) takes."""
    ll = llguidance.LLTokenizer(tok.to_str(), eos_token=0)
    matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
    ids = tok.encode(text, add_special_tokens=False).ids
    return matcher.consume_tokens(ids) and matcher.is_accepting()
