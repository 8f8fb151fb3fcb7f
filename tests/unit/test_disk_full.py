"""Which errors mean a full disk (a 507 with a message, not a 500 or a database outage)."""

from __future__ import annotations

import errno
import os
import shutil

from kiln_platform.errors import disk_full


def test_no_space_quota_and_file_size_limits_are_a_full_disk() -> None:
    for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        assert disk_full(OSError(code, os.strerror(code)))
    assert not disk_full(OSError(errno.EACCES, "denied"))
    assert not disk_full(ConnectionRefusedError())
    assert not disk_full(ValueError("bad"))


def test_a_full_disk_behind_another_error_or_in_copytree_is_found() -> None:
    wrapped = RuntimeError("unpacking failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert disk_full(wrapped)
    copytree = shutil.Error([("a", "b", f"[Errno 28] {os.strerror(errno.ENOSPC)}")])
    assert disk_full(copytree)
    assert not disk_full(shutil.Error([("a", "b", "[Errno 13] Permission denied")]))
