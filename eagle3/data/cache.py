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

log = logging.getLogger(__name__)


def cache_key(params: Any) -> str:
    """A short stable hash of JSON-serialisable parameters."""
    blob = json.dumps(params, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def build_once(target: Path, build: Callable[[Path], None], what: str) -> Path:
    """Builds `target` through a temporary sibling dir renamed into place, so a crash never leaves half an entry."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    log.info("building %s in %s", what, target)
    try:
        build(tmp)
        os.replace(tmp, target)
    except OSError:
        if not target.is_dir():  # another process may have won the rename race: theirs is as good
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
