"""What the training loop does at the top of each step, decided from where the run is (its `Progress`) and the
optim and logger settings: a train row, a stop, the end of an epoch, a val pass, a save of `checkpoints/last`.

Pure (no torch): the loop in eagle3/train/loop.py carries out a `Due` in its field order. A val pass that follows
a step comes after a train row (whatever logger.log_every says), so the val row's trained tokens are exact. A val
pass is due where one belongs (an optim.eval_every step inside an epoch, an epoch's or the run's last step) and
the latest val row is not of this step, so the pass that a stop left owed is simply due at the top of the resumed
run's first step.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from eagle3.rundir.progress import Progress


class Stop(Enum):
    skipped = "skipped"   # optim.max_skipped_steps steps in a row had a non-finite loss or gradient
    signal = "signal"     # SIGTERM or Ctrl-C: the run exits resumably


@dataclass(frozen=True)
class Due:
    """What is due at the top of a step, in the order the loop does it."""

    train_row: bool = False       # a train row of the steps since the last one
    stop: Stop | None = None      # save checkpoints/last, then stop the run
    next_epoch: bool = False      # the epoch is complete: progress moves on to the next one
    val_epoch: int | None = None  # a val pass is due; the epoch its row names
    epoch_end: bool = False       # the end of an epoch or of the run: its wall time goes into progress
    save: bool = False            # checkpoints/last
    done: bool = False            # no step follows


@dataclass(frozen=True)
class Cadence:
    """How often the loop logs, validates and saves, and how long it runs (optimizer steps)."""

    total_steps: int
    steps_per_epoch: int
    log_every: int = 1
    eval_every: int | None = None
    checkpoint_every: int | None = None
    max_skipped_steps: int = 10

    @classmethod
    def of(cls, epochs: int, max_steps: int | None, steps_per_epoch: int, log_every: int, eval_every: int | None,
           checkpoint_every: int | None, max_skipped_steps: int) -> Cadence:
        total = epochs * steps_per_epoch if max_steps is None else min(epochs * steps_per_epoch, max_steps)
        return cls(total, steps_per_epoch, log_every, eval_every, checkpoint_every, max_skipped_steps)

    def due(self, progress: Progress, stepped: bool = False, skipped_in_a_row: int = 0,
            stop_requested: bool = False) -> Due:
        """What is due at `progress`. `stepped`: the loop took a step since it last asked (false at the top of
        a run's or a resumed run's first step: a stop, a train row and a checkpoint_every save each follow a
        step, never a resume). `skipped_in_a_row`: the steps in a row with a non-finite loss or gradient."""
        step = progress.step
        train_row = stepped and (step % self.log_every == 0 or step == self.total_steps)
        if skipped_in_a_row >= self.max_skipped_steps:
            return Due(train_row=train_row, stop=Stop.skipped)
        if stepped and stop_requested:
            return Due(train_row=train_row, stop=Stop.signal)
        owed = progress.final.get("step") != step  # no val row of this step yet
        epoch_complete = progress.step_in_epoch >= self.steps_per_epoch
        if epoch_complete or step >= self.total_steps:
            # The end of an epoch (or of max_steps): evaluate, then checkpoint. Its row names the epochs begun.
            return Due(train_row=train_row or (stepped and owed), next_epoch=epoch_complete,
                       val_epoch=progress.epoch + 1 if owed else None, epoch_end=owed,
                       save=owed or self.total_steps == 0, done=step >= self.total_steps)
        val = owed and self.eval_every is not None and step % self.eval_every == 0
        save = stepped and self.checkpoint_every is not None and step % self.checkpoint_every == 0
        # A val pass after a step follows a train row, so the trained tokens it records are its step's own.
        return Due(train_row=train_row or (stepped and val), val_epoch=progress.epoch if val else None, save=save)
