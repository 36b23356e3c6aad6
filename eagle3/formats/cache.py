"""Content-keyed cache entries that are built once, atomically, and reused."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from eagle3.formats.disk import disk_full, disk_full_error
from eagle3.safe_write import fresh_temp, make_dirs, refuse_links

log = logging.getLogger(__name__)


def cache_key(params: Any) -> str:
    """A short stable hash of JSON-serialisable parameters."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build_once(target: Path, build: Callable[[Path], None], what: str) -> Path:
    """Builds `target` through a temporary sibling dir renamed into place, so a crash never leaves half an entry."""
    if target.is_dir():  # built (or linked to a built one by the user: only read)
        return target
    refuse_links(target.parent, target, what)  # a dangling link is never built through (eagle3.safe_write)
    make_dirs(target.parent, target.parent)
    tmp = fresh_temp(target.parent, target.with_name(f"{target.name}.tmp-{os.getpid()}"))
    tmp.mkdir()
    log.info("building %s in %s", what, target)
    try:
        build(tmp)
        os.replace(tmp, target)
    except Exception as e:
        if disk_full(e, tmp):
            raise disk_full_error(target, what, "nothing half-built is kept",
                                  "Free space, or set cache_dir (or $EAGLE3_CACHE) to another disk") from None
        if not (isinstance(e, OSError) and target.is_dir()):  # another process may have won the rename race
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
