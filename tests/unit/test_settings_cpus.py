"""``KILN_WORKER_CPUS`` is checked when Kiln reads its settings, and reaches the workers."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln_platform.settings import Settings
from kiln_runtimes import _cpus


@pytest.mark.parametrize("value", ["1", "2-7", "0,2-3"])
def test_worker_cpus_accepts_what_the_worker_parses(value: str) -> None:
    assert _cpus.parse(Settings(worker_cpus=value).worker_cpus or "")


@pytest.mark.parametrize("value", ["", "one", "1-", "1,,2", "-3"])
def test_worker_cpus_rejects_a_malformed_list_naming_the_field(value: str) -> None:
    with pytest.raises(ValidationError, match="worker_cpus"):
        Settings(worker_cpus=value)
