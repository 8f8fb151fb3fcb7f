"""``python -m kiln_console`` is the ``kiln`` command."""

from kiln_console.cli import main

main()
