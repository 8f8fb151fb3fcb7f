"""`/v1` HTTP handlers: thin, the behaviour lives in ``services``."""

from __future__ import annotations

from litestar import Controller, Request, get, post
from litestar.di import Provide
from litestar.params import SkipValidation

from kiln_platform.context import Kiln
from kiln_platform.gateway import services
from kiln_platform.gateway.auth import provide_principal
from kiln_platform.gateway.schemas import (
    EmbeddingsRequest,
    EmbeddingsResponse,
    ModelCard,
    ModelList,
)
from kiln_platform.keys.services import Principal

# Already-built objects: skip Litestar's per-request validation of their fields.
KilnDep = SkipValidation[Kiln]
PrincipalDep = SkipValidation[Principal]


class OpenAIController(Controller):
    """The OpenAI-compatible API."""

    path = "/v1"
    dependencies = {"principal": Provide(provide_principal)}  # noqa: RUF012

    @get("/models")
    async def list_models(self, kiln: KilnDep, principal: PrincipalDep) -> ModelList:
        """List served models."""
        versions = await kiln.resolver.refresh()
        return ModelList(data=[services.model_card(v) for v in versions])

    @get("/models/{model_id:str}")
    async def get_model(self, kiln: KilnDep, principal: PrincipalDep, model_id: str) -> ModelCard:
        """Describe one model."""
        return services.model_card(await kiln.resolver.resolve(model_id))

    @post("/embeddings", status_code=200)
    async def embeddings(
        self,
        request: Request[object, object, object],
        kiln: KilnDep,
        principal: PrincipalDep,
        data: EmbeddingsRequest,
    ) -> EmbeddingsResponse:
        """Create embeddings."""
        return await services.embed(kiln, principal, data, request.state.request_id)
