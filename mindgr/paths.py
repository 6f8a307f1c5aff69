"""Cheap checks that an output directory can be created and written, made before any long work starts.

`os.access` alone is not enough: root passes every permission check, yet still cannot write to a read-only
mount, so the check ends with a probe file created (and removed) in the nearest existing directory.
"""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
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


# Below this many free bytes, a writer library's own error (MindSpore's RuntimeError, say) met while
# writing is taken for a full disk.
_NEARLY_FULL = 1 << 20


def _full_disk(directory: Path) -> bool:
    try:
        return shutil.disk_usage(directory).free < _NEARLY_FULL
    except OSError:
        return False


def atomic_write(path, content, fsync: bool = False, tmp_suffix: str = ".tmp"):
    """Write `path` so that a reader sees the old file or the new one, never a part: into PATH + tmp_suffix
    beside it, then one rename. `content` is str, bytes, or a function given the temporary path that writes
    it (numpy, parquet, safetensors writers); `fsync` flushes the bytes to disk before the rename.

    A failed write leaves the old file as it was and raises an OSError that names `path` (a full disk:
    errno ENOSPC, also when a writer library reports it in its own exception type), so that the command
    line can say in one line what could not be written."""
    path = Path(path)
    tmp = path.with_name(path.name + tmp_suffix)
    try:
        if callable(content):
            content(tmp)
        else:
            with open(tmp, "wb" if isinstance(content, bytes) else "w") as f:
                f.write(content)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
        if fsync and callable(content):
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        if e.filename is None or str(e.filename) == str(tmp):     # name the file meant, not the temporary
            raise OSError(e.errno, e.strerror or str(e), str(path)) from e
        raise
    except Exception as e:
        Path(tmp).unlink(missing_ok=True)
        if _full_disk(path.parent):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from e
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_json_atomic(path, data, indent: int | None = 1, sort_keys: bool = True):
    """`data` as JSON, written atomically (atomic_write)."""
    import json
    return atomic_write(path, json.dumps(data, indent=indent, sort_keys=sort_keys))


def file_sha256(path) -> str:
    """The sha256 of a file's bytes (checkpoints, exports), read in 1 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
