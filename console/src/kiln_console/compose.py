"""Kiln's full application: the platform's API with the console mounted at ``/console``.

The console is the top layer (runtimes <- platform <- console), so the composition lives here:
``kiln up`` and every test or bench that serves the whole of Kiln builds it with this."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_console.app import console
from kiln_platform import app

if TYPE_CHECKING:
    from litestar import Litestar

    from kiln_platform.settings import Settings


def create_app(settings: Settings) -> Litestar:
    """The platform app, with the console's router and templates."""
    web = console(settings)
    return app.create_app(settings, route_handlers=[web.router], template_config=web.templates)
