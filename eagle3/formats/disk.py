"""Disk space: refusing a write the disk cannot hold before it starts, and naming a full disk when a write fails
anyway (another process filled it), as one message. Imports nothing heavy."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from eagle3.errors import ConfigError, DataError

FULL = (errno.ENOSPC, errno.EDQUOT)


def check_free(path: Path, needed: int, what: str, advice: str) -> None:
    """Refuses (ConfigError) when the filesystem of `path` (or of its nearest existing parent) has less than
    `needed` bytes free for `what`."""
    existing = Path(path)
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < needed:
        raise ConfigError(f"{path}: {free / 2**30:.2f} GiB free, but {what} need about {needed / 2**30:.2f} GiB; "
                          f"{advice}")


def disk_full(error: BaseException, path: Path) -> bool:
    """Whether a failed write into `path` ran out of space: an OSError saying so, a library's error that carries
    the OS's (safetensors: "os error 28"), or one that says nothing useful (torch.save: "unexpected pos") while the
    disk has no room left."""
    if isinstance(error, OSError) and error.errno in FULL:
        return True
    text = str(error)
    if "No space left on device" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    existing = Path(path)
    while not existing.exists():
        existing = existing.parent
    return isinstance(error, (OSError, RuntimeError)) and shutil.disk_usage(existing).free < 2**20


def disk_full_error(path: Path, what: str, kept: str, advice: str) -> DataError:
    """The one message for a write of `what` into `path` that ran out of space."""
    return DataError(f"no space left on the disk of {path} while writing {what}; {kept}. {advice}")
