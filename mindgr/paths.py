"""Cheap checks that an output directory can be created and written, made before any long work starts.

`os.access` alone is not enough: root passes every permission check, yet still cannot write to a read-only
mount, so the check ends with a probe file created (and removed) in the nearest existing directory.
"""
from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path


def unwritable_reason(target) -> str | None:
    """Why the directory `target` (which may not exist yet) cannot be created or written; None if it can."""
    target = Path(target)
    if target.exists() and not target.is_dir():
        return f"{target}: exists and is not a directory"
    probe_dir = target
    while not probe_dir.exists():
        parent = probe_dir.parent
        if parent == probe_dir:
            break
        probe_dir = parent
    if not probe_dir.is_dir():
        return f"{probe_dir}: is not a directory (needed for {target})"
    try:
        fd, name = tempfile.mkstemp(prefix=".mindgr-probe-", dir=probe_dir)
        os.close(fd)
        os.unlink(name)
    except OSError as e:
        what = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EPERM: "operation not permitted", errno.ENOSPC: "no space left on device"}
        reason = what.get(e.errno, e.strerror or str(e))
        return f"{probe_dir}: cannot write ({reason})" + (f", needed for {target}" if probe_dir != target else "")
    return None
