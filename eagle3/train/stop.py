"""Stopping a run on a signal: SIGTERM (preemption) or Ctrl-C lets the current step finish, then the loop saves
`checkpoints/last` and exits resumably, all ranks at the same step."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from eagle3.console import resume_command
from eagle3.device.distributed import World, reduce_sums
from eagle3.errors import Interrupted, StoppedBeforeTraining
from eagle3.signal_scope import raising_on

log = logging.getLogger(__name__)


@contextmanager
def stop_before_training(what: str) -> Iterator[None]:
    """SIGTERM or Ctrl-C while `what` runs, before the run's first step: the signal raises StoppedBeforeTraining
    where the code is, so the `finally` blocks on the way out remove temporary files (a cache entry is built in a
    temporary dir, eagle3/formats/cache.py), and the launcher says so in one line (eagle3/run/launch.py) and exits
    with 128 + the signal."""
    with raising_on(StopRequest.SIGNALS, lambda signum: StoppedBeforeTraining(signum, what)):
        yield


class StopRequest:
    """SIGTERM (preemption) or Ctrl-C: the current step finishes, `last` is saved, the run exits resumably.
    A second Ctrl-C exits at once."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            self.previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum
        log.warning("%s received: finishing this step, then saving checkpoints/last (Ctrl-C again exits at once)",
                    signal.Signals(signum).name)

    def requested(self, world: World) -> bool:
        """Whether any rank was signalled (a collective when distributed, so all ranks stop at the same step)."""
        flag = float(self.signum is not None)
        if world.distributed:
            flag = reduce_sums({"stop": flag}, world)["stop"]
        return flag > 0

    def exit(self, run_dir: Path, step: int) -> None:
        signum = self.signum or signal.SIGTERM
        self.restore()
        log.warning("interrupted at step %d; checkpoints/last holds it. Continue with: %s", step,
                    resume_command(run_dir))
        raise Interrupted(signum)

    def restore(self) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
        self.previous = {}
