"""Errors raised inside rank processes, carried to the launcher: each failing rank writes a small record into the
run dir (`rank_errors/rank_<N>.json`), and the launcher reports the first one instead of torch elastic's
ChildFailedError, which holds neither the message nor the traceback.

The first failure is the cause: once one rank fails, the others fail after it (a collective whose peer is gone,
or the agent's SIGTERM), so records are ordered by the time they were written. Imports nothing heavy.
"""

from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from eagle3 import errors, safe_write
from eagle3.errors import UserError

RECORDS_DIR = "rank_errors"


@dataclass
class RankError:
    rank: int
    type: str           # the exception's class name
    message: str
    traceback: str
    time: float         # seconds since the epoch when the rank caught it
    user: bool          # a UserError (one message) rather than a bug (a traceback)

    def as_exception(self, run_dir: Path) -> Exception:
        """The error the launcher raises for it: a user error of the same kind, one message; a bug as
        `RankFailed`, pointing at where its traceback is."""
        if self.user:
            kind = getattr(errors, self.type, None)
            if not (isinstance(kind, type) and issubclass(kind, UserError)):
                kind = UserError
            return kind(f"rank {self.rank}: {self.message}")
        log_name = "launch.log" if self.rank == 0 else f"rank_{self.rank}.log"
        return RankFailed(f"rank {self.rank} failed: {self.type}: {self.message} (traceback in "
                          f"{Path(run_dir) / log_name} and failure.json)", self.traceback)


class RankFailed(Exception):
    """A bug inside a rank: the launcher prints this one line; the rank's traceback goes into failure.json."""

    def __init__(self, message: str, rank_traceback: str) -> None:
        super().__init__(message)
        self.rank_traceback = rank_traceback


def write_rank_error(run_dir: Path, rank: int, error: BaseException) -> RankError:
    record = RankError(rank=rank, type=type(error).__name__, message=str(error),
                       traceback="".join(traceback.format_exception(error)), time=time.time(),
                       user=isinstance(error, UserError))
    records = Path(run_dir) / RECORDS_DIR
    try:
        safe_write.write_text(run_dir, records / f"rank_{rank}.json", json.dumps(asdict(record), indent=2) + "\n")
    except (OSError, UserError):
        pass  # the run dir is gone or full, or a link stands in the way: the rank's log still holds the error
    return record


def first_rank_error(run_dir: Path, since: float = 0.0) -> RankError | None:
    """The earliest record written at or after `since` (this launch's start: a resumed run's dir may hold older
    ones)."""
    found = []
    for path in sorted((Path(run_dir) / RECORDS_DIR).glob("rank_*.json")):
        try:
            record = RankError(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if record.time >= since:
            found.append(record)
    return min(found, key=lambda r: r.time, default=None)
