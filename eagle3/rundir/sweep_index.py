"""A sweep's index.json (`SweepIndex(sweep_dir)`): one entry per job, what it ran with, how it ended and its
headline results; jobs finishing at once each update it under a lock, and every write is whole."""

from __future__ import annotations

import dataclasses
import fcntl
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3 import safe_write
from eagle3.errors import ConfigError
from eagle3.rundir.progress import RunSummary
from eagle3.rundir.records import record_from_dict, record_to_dict, write_json

SWEEP_INDEX = "index.json"


@dataclass
class IndexEntry:
    """One job of a sweep in its index.json: what it ran with, how it ended, and its headline results."""

    num: int
    name: str
    run_dir: str | None
    overrides: list[str]
    status: str                          # completed | failed | stopped | interrupted
    error: str | None = None
    resume: str | None = None            # a stopped job's resume command
    steps: int | None = None
    best_tau_sim: float | None = None
    best_step: int | None = None
    final_loss: float | None = None
    final_tau_sim: float | None = None

    @classmethod
    def from_dict(cls, plain: Any) -> IndexEntry:
        return record_from_dict(cls, plain)

    def to_dict(self) -> dict[str, Any]:
        return record_to_dict(self, omit_none=("resume", "steps", "best_tau_sim", "best_step", "final_loss",
                                               "final_tau_sim"))

    def with_results(self, summary: RunSummary | None) -> IndexEntry:
        if summary is None:
            return self
        return dataclasses.replace(self, steps=summary.steps, best_tau_sim=summary.best["tau_sim"],
                                   best_step=summary.best["step"], final_loss=summary.final["loss"],
                                   final_tau_sim=summary.final["tau_sim"])


class SweepIndex:
    """`<sweep_dir>/index.json`: one entry per job, by `num`. Jobs of a sweep may finish at once (Slurm, optuna's
    n_jobs): each update holds a lock around its read-modify-write."""

    def __init__(self, sweep_dir: str | Path) -> None:
        self.dir = Path(sweep_dir)
        self.file = self.dir / SWEEP_INDEX

    def exists(self) -> bool:
        return self.file.exists()

    def entries(self) -> list[IndexEntry]:
        """The entries; ConfigError naming the file when it is not a sweep index."""
        if not self.file.exists():
            return []
        try:
            plain = json.loads(self.file.read_text(encoding="utf-8"))
            jobs = plain["jobs"] if isinstance(plain, dict) else None
            if not isinstance(jobs, list):
                raise ValueError("no list of 'jobs'")
            return [IndexEntry.from_dict(job) for job in jobs]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{self.file} is not a sweep index ({e})") from None

    def by_num(self) -> dict[int, IndexEntry]:
        return {entry.num: entry for entry in self.entries()}

    def put(self, entry: IndexEntry) -> None:
        """Replaces the job's entry (by `num`)."""
        with safe_write.open_write(self.dir, self.dir / "index.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            jobs = [e for e in self.entries() if e.num != entry.num] + [entry]
            write_json(self.file, {"sweep_dir": str(self.dir.resolve()),
                                   "jobs": [e.to_dict() for e in sorted(jobs, key=lambda e: e.num)]}, self.dir)
