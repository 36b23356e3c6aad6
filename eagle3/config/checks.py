"""The checks every schema's `check()` is written with: one ConfigError naming the key (`require`), a sampling
temperature's range, and a path that must be a directory holding given entries (said by what the path is instead:
missing, a regular file, a FIFO ...)."""

from __future__ import annotations

import math
import os
import stat
from pathlib import Path

from eagle3.errors import ConfigError


def require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def require_temperature(key: str, value: float, greedy: bool = True) -> None:
    """The one check of every sampling temperature (`key` names it): finite, and >= 0 where 0 means greedy
    (`greedy`), else > 0. NaN would sample from NaN logits, and inf from a uniform distribution whatever the
    verifier says: tokens no model would write, silently trained on or measured."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and (value >= 0 if greedy else value > 0)
    require(ok, key, f"must be >= 0 and finite, got {value}" if greedy else
            f"must be > 0 and finite (it samples, never greedy), got {value}")


def path_kind(p: Path, wanted: str) -> str:
    """Why `p` is not `wanted` ("a directory", ...), said after its name: "does not exist", "is a FIFO (named pipe),
    not a directory", ... (the mode only: a FIFO is never opened, reading it would block)."""
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return "is a symlink to nothing (its target does not exist)" if p.is_symlink() else "does not exist"
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return f"is {next((name for test, name in kinds if test(mode)), 'of an unknown kind')}, not {wanted}"


def require_dir(path: str, key: str, entries: list[str], what: str) -> None:
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{key}: {path} {path_kind(p, 'a directory')}; expected {what}")
    missing = [e for e in entries if not (p / e).exists()]
    if missing:
        raise ConfigError(f"{key}: {path} has no {', '.join(missing)}; expected {what}")
