"""One initialised, migrated embedded PostgreSQL per test session, copied into each e2e data
directory, so a ``kiln up`` does not run initdb and every migration again (about 3 s each)."""

from __future__ import annotations

import functools
import shutil
import subprocess
import tempfile
from pathlib import Path

from kiln_platform.db.database import open_database
from kiln_platform.db.engine import embedded_server
from kiln_platform.settings import Settings
from tests.conftest import no_fsync, run_async


async def _migrate(settings: Settings) -> None:
    async with open_database(settings):
        pass


@functools.cache
def _template() -> Path:
    """A data directory whose ``pg`` is stopped, at the head revision (made on first use)."""
    settings = Settings(data_dir=Path(tempfile.mkdtemp(prefix="kiln-e2e-template-")))
    with embedded_server(settings.pg_dir) as uri:
        run_async(no_fsync(uri))  # durability is not under test (see tests/conftest.py)
    run_async(_migrate(settings))  # restarts it with the settings above
    return settings.pg_dir


def copy_migrated_pg(pg_dir: Path) -> Path:
    """Make ``pg_dir`` (not there yet) a copy of the session's migrated PostgreSQL; returns it.

    A data directory's own server secret is still made on first use: each start of Kiln sets
    ``kiln_app``'s password from the secret it has.
    """
    # cp -a keeps the owner: as root, pgserver runs PostgreSQL as its own unprivileged user
    subprocess.run(["cp", "-a", str(_template()), str(pg_dir)], check=True)
    return pg_dir


def remove_template() -> None:
    """Delete the session's template (if one was made)."""
    if _template.cache_info().currsize:
        shutil.rmtree(_template().parent, ignore_errors=True)
