"""``python -m kiln_platform`` is the ``kiln`` command."""

from kiln_platform.cli import main

main()
