"""What a run has done, as typed records: the training loop's `Progress` (saved in checkpoints/last's
trainer_state.pt, so a resumed run continues it) and the `RunSummary` (`<run_dir>/summary.json`).

Both are stored as plain dicts of numbers, strings and metric rows (`dataclasses.asdict`), so trainer_state.pt
loads with `torch.load(weights_only=True)` and summary.json keeps its keys for eagle3.sweep.compare and other readers.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from eagle3.errors import CheckpointError
from eagle3.rundir.records import record_from_dict

CHECKPOINTS = "checkpoints"
CHECKPOINT_NAMES = ("last", "best")


def relative_checkpoints() -> dict[str, str]:
    """summary.json's checkpoints: relative to the run dir, so that they name this run's wherever it lies."""
    return {name: f"{CHECKPOINTS}/{name}" for name in CHECKPOINT_NAMES}


Row = dict[str, Any]  # a metrics.jsonl row: {"step", "split", "epoch", "loss", "tau_sim", ...}


@dataclass
class Progress:
    """Where the training loop is; only the loop (eagle3.train.loop) advances it."""

    step: int = 0                 # optimizer steps taken (skipped ones included)
    epoch: int = 0                # epochs completed
    step_in_epoch: int = 0        # steps taken in the current epoch
    tokens: float = 0.0           # trained tokens, counted at each train row (summed over ranks)
    train_wall_s: float = 0.0     # seconds in the loop, across resumes
    skipped_steps: int = 0        # steps with a non-finite loss or gradient: nothing applied
    step0: Row = field(default_factory=dict)   # the val row before any update
    best: Row = field(default_factory=dict)    # the val row with the highest tau_sim so far
    final: Row = field(default_factory=dict)   # the latest val row

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict[str, Any], where: Path) -> Progress:
        names = {f.name for f in fields(cls)}
        if set(saved) != names:
            raise CheckpointError(f"{where}: its progress has keys {sorted(saved)}, this version saves "
                                  f"{sorted(names)}; "
                                  "it was written by another version of eagle3 and cannot be resumed by this one")
        return cls(**saved)


@dataclass
class RunSummary:
    """summary.json: step-0, final and best val rows, steps, tokens/s, wall time, checkpoints, and the verifier
    and data dirs the run used."""

    steps: int
    tokens: float
    tokens_per_s: float | None    # None when no training step ran (optim.max_steps=0)
    train_wall_s: float
    step0: Row
    final: Row
    best: Row
    checkpoints: dict[str, str]   # "last" and "best" -> checkpoint dir, relative to the run dir
    verifier_dir: str
    data_dir: str
    device: str
    world_size: int
    # git commit and library versions of the run, the best checkpoint's sha256 (eagle3/provenance.py)
    provenance: dict[str, Any] | None = None
    # This job's wall time (rank 0's process, from its start; a resumed run: the resuming job's) and its seconds by
    # phase (JobClock.PHASES and "other", what none of them covers); None in a summary written before they were kept
    wall_s: float | None = None
    phases_s: dict[str, float] | None = None

    @classmethod
    def of(cls, progress: Progress, verifier_dir: Path, data_dir: Path, device: str, world_size: int) -> RunSummary:
        wall = progress.train_wall_s
        clock = job_clock()
        return cls(steps=progress.step, tokens=progress.tokens,
                   tokens_per_s=progress.tokens / wall if wall > 0 else None, train_wall_s=wall,
                   step0=progress.step0, final=progress.final, best=progress.best,
                   checkpoints=relative_checkpoints(),
                   verifier_dir=str(verifier_dir), data_dir=str(data_dir), device=device, world_size=world_size,
                   wall_s=round(clock.wall(), 3), phases_s=clock.by_phase())

    @classmethod
    def from_dict(cls, plain: Any) -> RunSummary:
        """summary.json's record; ValueError saying what is missing or mistyped (eagle3.rundir.records.read_record)."""
        return record_from_dict(cls, plain)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def process_start() -> float:
    """When this process started (time.time()'s clock; /proc/self/stat's start time), or now where that is unknown:
    the interpreter's and the libraries' imports are part of a job's start-up."""
    try:
        import os

        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.time()


class JobClock:
    """Where a job's wall time went, by phase: start-up (the process and its imports, the config, the verifier and
    the draft built, up to the loop), data build (the verifier's and the data's inputs built and checked, the
    loaders), val passes, training steps and saves. The launcher and the loop time theirs (`phase`); `by_phase`
    adds "other", the wall time none of them covers (end-of-run logging, the tracker)."""

    PHASES = ("start-up", "data build", "val passes", "training steps", "saves")

    def __init__(self, start: float):
        self.start = start
        self.seconds: dict[str, float] = {}
        self.in_phase = False

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Times the block into `name`; a phase inside another (a save inside a val pass) counts once, in the outer."""
        if self.in_phase:
            yield
            return
        started, self.in_phase = time.time(), True
        try:
            yield
        finally:
            self.in_phase = False
            self.seconds[name] = self.seconds.get(name, 0.0) + time.time() - started

    def loop_starts(self) -> None:
        """The training loop begins: the job's time so far that no phase covered was its start-up."""
        if "start-up" not in self.seconds:
            self.seconds["start-up"] = max(0.0, self.wall() - sum(self.seconds.values()))

    def wall(self) -> float:
        return time.time() - self.start

    def by_phase(self) -> dict[str, float]:
        out = {name: round(self.seconds.get(name, 0.0), 3) for name in self.PHASES}
        out["other"] = round(max(0.0, self.wall() - sum(out.values())), 3)
        return out


_clock = JobClock(process_start())
_jobs = 0


def start_job() -> JobClock:
    """A new job's clock: from the process's start for its first job, from now for a sweep's later ones."""
    global _clock, _jobs
    _clock = JobClock(process_start() if _jobs == 0 else time.time())
    _jobs += 1
    return _clock


def job_clock() -> JobClock:
    return _clock


def format_result_table(summary: RunSummary, ttt_steps: int) -> str:
    """Step 0 against final against best: the numbers a user looks at after a run."""
    cols = [("step 0", summary.step0), ("final", summary.final), ("best", summary.best)]
    keys = ["step", "loss", "tau_sim"] + [f"full_acc_{k}" for k in range(ttt_steps)]
    if any("accept_len" in row for _, row in cols):  # eval.accept: measured beside simulated
        keys.append("accept_len")
    lines = [f"{'val':<12}" + "".join(f"{name:>12}" for name, _ in cols)]
    for key in keys:
        cells = []
        for _, row in cols:
            v = row.get(key)
            cells.append(f"{v:>12}" if isinstance(v, int) else f"{v:>12.4f}" if v is not None else f"{'-':>12}")
        lines.append(f"{key:<12}" + "".join(cells))
    if summary.phases_s and summary.wall_s:
        lines.append(f"wall time {summary.wall_s:.1f} s: " + ", ".join(
            f"{name} {s:.1f} s ({s / summary.wall_s:.0%})" for name, s in summary.phases_s.items()))
    return "\n".join(lines)
