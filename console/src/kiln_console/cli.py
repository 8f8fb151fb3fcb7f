"""The ``kiln`` command: the platform's command groups, and ``kiln up`` serving the full app
(``compose.create_app``, imported only when ``kiln up`` builds it: the other commands need
neither Litestar nor the console, and a command should start in a fraction of a second)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kiln_platform.cli import kiln, up

if TYPE_CHECKING:
    from litestar import Litestar

    from kiln_platform.settings import Settings


def _create_app(settings: Settings) -> Litestar:
    from kiln_console.compose import create_app

    return create_app(settings)


main = kiln(up.command(_create_app))
