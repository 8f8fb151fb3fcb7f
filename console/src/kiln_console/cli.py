"""The ``kiln`` command: the platform's command groups, and ``kiln up`` serving the full app
(``compose.create_app``)."""

from __future__ import annotations

from kiln_console.compose import create_app
from kiln_platform.cli import kiln, up

main = kiln(up.command(create_app))
