"""What a job leaves about how it ended: `failure.json` in its run dir when it failed (so a sweep's survivors stay
readable) and its entry in its sweep's index.json; a resumed sweep job updates the entry it already has, and tells
an Optuna study there the trial's value. The launcher calls one method per way a job ends. Imports nothing heavy.
"""

from __future__ import annotations

import logging
import signal
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3.console import resume_command
from eagle3.errors import ConfigError, StoppedBeforeTraining
from eagle3.rundir.files import RESOLVED_CONFIG, FailureRecord, RunDir
from eagle3.rundir.sweep_index import IndexEntry, SweepIndex
from eagle3.sweep.study import STUDY_FILE

if TYPE_CHECKING:
    from eagle3.rundir.progress import RunSummary

log = logging.getLogger(__name__)


@dataclass
class JobOutcome:
    """One job's bookkeeping. `ours` turns true once the run dir is this run's (its config written, or resumed):
    records go only where they describe this job, never into a run a refused command pointed at."""

    run: RunDir
    multirun: bool
    resume: bool
    entry: IndexEntry | None = None   # a sweep job's entry: num, name, run dir, overrides
    sweep_dir: Path | None = None
    ours: bool = False

    @classmethod
    def of(cls, hydra, run_dir: Path, resume: bool) -> JobOutcome:
        multirun = hydra.mode is not None and hydra.mode.name == "MULTIRUN"
        if not multirun:
            return cls(RunDir(run_dir), multirun, resume)
        entry = IndexEntry(num=hydra.job.num, name=hydra.job.override_dirname, run_dir=str(run_dir),
                           overrides=list(hydra.overrides.task), status="")
        return cls(RunDir(run_dir), multirun, resume, entry, Path(hydra.sweep.dir))

    def interrupted(self) -> None:
        """A signal before training: nothing to resume, a sweep job is recorded as not run."""
        if self.multirun:
            self._index("interrupted", None, "stopped by a signal before training")

    def stop_line(self, stop: StoppedBeforeTraining) -> str:
        """The one line of a job a signal stopped outside its training loop: what was running, and what `resume=`
        does with the run dir now (eagle3/run/resume.py: start it again from step 0, or continue it)."""
        from eagle3 import safe_write
        from eagle3.rundir.files import LOCK

        said = f"{signal.Signals(stop.signum).name} while {stop.during or 'running'}: stopped"
        room = self.run
        if not (self.ours or (room.is_run() and safe_write.holds(room.file(LOCK)))):
            return f"{said} before the run started; nothing was written: the same command starts it"
        if room.took_a_step():
            return f"{said}; continue it with: {resume_command(room.path)}"
        return (f"{said} before its first step; nothing half-built is kept: start it again from step 0 with "
                f"{resume_command(room.path)}")

    def stopped(self) -> None:
        """checkpoints/last is saved and the resume line printed: resumable, not failed."""
        self._index("stopped", None)

    def failed(self, error: Exception) -> None:
        message = f"{type(error).__name__}: {error}"
        # A sweep job's fresh dir is its own even before its config is written; a reused one is not.
        ours = self.ours or (self.multirun and not self.resume and not self.run.file(RESOLVED_CONFIG).exists())
        if ours:
            record_failure(self.run.path, message, getattr(error, "rank_traceback", None))
            self._index("failed", None, message)
        if self.multirun and self.entry is not None:
            log.error("job %d (%s) failed: %s\n  run dir: %s", self.entry.num,
                      " ".join(self.entry.overrides) or "no overrides", error, self.run.path)

    def completed(self, summary: RunSummary, objective: float | None) -> None:
        self.run.clear_failure()  # a resumed run that completes has not failed
        self._index("completed", summary, objective=objective)

    def _index(self, status: str, summary: RunSummary | None, error: str | None = None,
               objective: float | None = None) -> None:
        if self.multirun and self.entry is not None and self.sweep_dir is not None:
            write_index_entry(self.sweep_dir, self.entry, status, summary, error)
        elif self.resume and self.ours:
            update_resumed_sweep_job(self.run.path, status, summary, error, objective)


def record_failure(run_dir: Path, error: str, error_traceback: str | None = None) -> None:
    """failure.json: the error and a rank's own traceback, or else the one being handled here."""
    run = RunDir(run_dir)
    if not run.path.is_dir():
        return
    try:
        run.write_failure(FailureRecord(error=error, traceback=error_traceback or traceback.format_exc()))
    except OSError as e:  # a full disk, the failure itself perhaps: the console still has the message
        log.warning("%s: the failure record could not be written (%s)", run.file("failure.json"), e.strerror or e)


def write_index_entry(sweep_dir: Path, job: IndexEntry, status: str, summary: RunSummary | None,
                      error: str | None) -> None:
    """Replaces the job's entry (by `num`) in the sweep's index. A stopped job gets its resume command."""
    resume = resume_command(job.run_dir) if status == "stopped" and job.run_dir else None
    entry = IndexEntry(num=job.num, name=job.name, run_dir=job.run_dir, overrides=job.overrides, status=status,
                       error=error, resume=resume)
    SweepIndex(sweep_dir).put(entry.with_results(summary))


def update_resumed_sweep_job(run_dir: Path, status: str, summary: RunSummary | None,
                             error: str | None = None, objective: float | None = None) -> None:
    """A resumed sweep job's entry in its sweep's index.json (the run dir's parent), if it has one; a trial of an
    Optuna study there that ended is told to the study (its value, or FAIL)."""
    index = SweepIndex(run_dir.parent)
    try:
        jobs = index.entries()
    except ConfigError as e:  # the run's own records are written; the sweep's index is not this run's to fix
        log.warning("%s; this job's entry was not updated", e)
        return
    for job in jobs:  # by the job dir's name: the sweep dir may have been moved since it was written
        if job.run_dir is not None and Path(job.run_dir).name == run_dir.name:
            write_index_entry(run_dir.parent, IndexEntry(num=job.num, name=job.name, run_dir=str(run_dir),
                                                         overrides=job.overrides, status=status), status, summary,
                              error)
            if status != "stopped" and (run_dir.parent / STUDY_FILE).is_file():
                from eagle3.sweep.study import tell_resumed_trial

                tell_resumed_trial(run_dir.parent, job.num, objective if status == "completed" else None)
            return
