"""The train rows and the console bar: the window of counted metrics the steps since the last row add up
(train_step adds to it), turned into a row of metrics.jsonl / wandb once the loop has reduced it over ranks.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tqdm import tqdm

from eagle3.device.distributed import World
from eagle3.eval.metric_sums import summarize
from eagle3.rundir.progress import Progress
from eagle3.train.track import Tracker

__all__ = ["StepLog"]


class StepLog:
    """The console bar and the train rows. `window` collects the counted metrics of the steps since the last
    row (train_step adds to it); it formats rows from the progress it is given and changes none of it."""

    def __init__(self, tracker: Tracker, world: World, scheduler: Any, total_steps: int, progress: Progress):
        self.tracker, self.scheduler = tracker, scheduler
        self.window: dict[str, Any] = {}
        self.grad_norm: torch.Tensor | float = float("nan")
        self.start = time.perf_counter() - progress.train_wall_s
        self.bar = tqdm(total=total_steps, initial=progress.step, desc="train", unit="step",
                        disable=not world.is_main, dynamic_ncols=True)

    def wall(self) -> float:
        return time.perf_counter() - self.start

    def count(self, grad_norm: torch.Tensor | None) -> None:
        """A step was taken: the bar moves; a finite gradient norm is the one the next row shows."""
        if grad_norm is not None:
            self.grad_norm = grad_norm
        self.bar.update()

    def take_window(self) -> dict[str, Any]:
        window, self.window = self.window, {}
        return window

    def log(self, progress: Progress, sums: dict[str, Any]) -> None:
        row = {"step": progress.step, "split": "train", "epoch": progress.epoch, **summarize(sums),
               "lr": self.scheduler.get_last_lr()[0], "grad_norm": float(self.grad_norm),
               "tokens": progress.tokens, "tokens_per_s": progress.tokens / progress.train_wall_s,
               "skipped_steps": progress.skipped_steps}
        self.tracker.log(row)
        self.bar.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row.get('full_acc_0', 0):.3f}")

    def close(self) -> None:
        self.bar.close()
