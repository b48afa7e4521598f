"""What a failed write to a shard's output means: ``OutputUnwritable`` when a retry would fail the same way (a
read-only or forbidden output root, a disk still full), else ``OutputError``; each names the file and the shard
and says what to fix in ``output_root``. ``store.py`` writes the files; this module only names its failures.
"""

from __future__ import annotations

import errno as errno_codes
import os
from pathlib import Path

from fleetgen.errors import OutputError, OutputUnwritable

# Errors that say the output cannot take more bytes or cannot be written at all.
_NO_SPACE = (errno_codes.ENOSPC, errno_codes.EDQUOT, errno_codes.EFBIG)
_NEVER_WRITABLE = (errno_codes.EROFS, errno_codes.EACCES, errno_codes.EPERM)


class OutputErrorsAs:
    """Context manager: an ``OSError`` inside becomes the ``OutputError`` that names ``path`` and the shard."""

    def __init__(self, path: Path, shard_id: int, attempted: int = 0) -> None:
        self.path, self.shard_id, self.attempted = path, shard_id, attempted

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, traceback) -> bool:
        if isinstance(exc, OSError):
            raise output_error(exc, Path(exc.filename) if exc.filename else self.path, self.shard_id,
                               self.attempted) from exc
        return False


def output_error(exc: OSError, path: Path, shard_id: int, attempted: int) -> OutputError:
    """The error for a failed write to ``path``: ``OutputUnwritable`` when a retry would fail the same way.

    A full disk counts as such unless space came back in the meantime (someone freed some): then a
    retry, which resumes from the output on disk, may well finish.
    """
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno in _NO_SPACE:
        free = _free_bytes(path)
        needed = max(attempted, 1) + (1 << 20)
        if free is None or free < needed:
            return OutputUnwritable(
                f"cannot write the shard's output: {reason} ({_mib(free)} free)", errno=exc.errno,
                shard=shard_id, path=str(path),
                hint="free space on (or raise the quota of) the file system of output_root, or point "
                     "output_root elsewhere; then clear the task: it resumes from what is on disk")
        return OutputError(f"cannot write the shard's output: {reason}; {_mib(free)} are free again now",
                           errno=exc.errno, shard=shard_id, path=str(path),
                           hint="space was freed meanwhile: a retry resumes from what is on disk")
    if exc.errno in _NEVER_WRITABLE:
        return OutputUnwritable(f"cannot write the shard's output: {reason}", errno=exc.errno, shard=shard_id,
                                path=str(path), hint="output_root must be a writable folder for the "
                                "worker's user on every worker; fix its permissions or choose another")
    return OutputError(f"cannot write the shard's output: {reason}", errno=exc.errno, shard=shard_id,
                       path=str(path), hint="check the file system of output_root (dmesg, mount state); "
                       "a retry resumes from what is on disk")


def _free_bytes(path: Path) -> int | None:
    for candidate in (path, *path.parents):
        try:
            stat = os.statvfs(candidate)
        except OSError:
            continue
        return stat.f_bavail * stat.f_frsize
    return None


def _mib(free: int | None) -> str:
    return "unknown space" if free is None else f"{free / (1 << 20):.1f} MiB"
