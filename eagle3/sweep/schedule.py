"""The lr schedule a run trains under, as eagle3.sweep.forecast needs it: the lr multiplier (lr / peak lr) of every
step of the planned run, the "effective tokens" trained by a step (tokens x the multiplier, summed) and the
anneal still to come (1 - the multiplier).

The schedule is the run's own: eagle3.train.loop's (transformers' get_scheduler) linear warmup over
ceil(optim.warmup_ratio x total steps), then cosine or linear decay to 0 at the total, or constant. The total is
the planned run's: summary.json's steps (a finished run), else the "for N steps" its launch.log names as the loop
starts, else optim.max_steps. A pilot cut from a longer run (`--until`) so knows the lr its remaining steps will
have. Without a total (or with another scheduler) there is no schedule: the forecast is in tokens, as if the lr
stayed where it is.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

KINDS = ("cosine", "linear", "constant")
STEPS_LINE = re.compile(r"parameters for (\d+) steps")


@dataclass(frozen=True)
class Schedule:
    kind: str                 # cosine | linear | constant
    warmup_ratio: float
    total_steps: int
    tokens_per_step: float    # the pilot's tokens so far / its steps so far
    source: str               # where the total came from

    @property
    def warmup_steps(self) -> int:
        return math.ceil(self.warmup_ratio * self.total_steps)

    @property
    def planned_tokens(self) -> float:
        return self.total_steps * self.tokens_per_step

    def multipliers(self, total_steps: int | None = None) -> Any:
        """lr / peak of the update at each step 1..total (numpy array; index 0 is step 1): transformers' lambda at
        the scheduler's count before that step. `total_steps`: the same recipe stretched to that many steps."""
        import numpy as np

        total = total_steps or self.total_steps
        warmup = math.ceil(self.warmup_ratio * total)
        i = np.arange(total, dtype=float)
        rise = i / max(1, warmup)
        after = np.clip((i - warmup) / max(1, total - warmup), 0.0, 1.0)
        fall = {"cosine": 0.5 * (1.0 + np.cos(math.pi * after)), "linear": 1.0 - after,
                "constant": np.ones_like(after)}[self.kind]
        return np.where(i < warmup, rise, fall)

    def effective(self, total_steps: int | None = None) -> Any:
        """Effective tokens after each step 0..total (numpy array of total + 1): tokens x lr / peak, summed."""
        import numpy as np

        return np.concatenate([[0.0], np.cumsum(self.multipliers(total_steps))]) * self.tokens_per_step

    def anneal(self, total_steps: int | None = None) -> Any:
        """1 - lr / peak after each step 0..total (numpy array of total + 1; 0 at step 0): the anneal done."""
        import numpy as np

        m = self.multipliers(total_steps)
        return np.concatenate([[0.0], 1.0 - m])

    @cached_property
    def planned(self) -> tuple[Any, Any]:
        """effective() and anneal() of the planned run, computed once."""
        return self.effective(), self.anneal()

    def at_point(self, step: int, tokens: float) -> tuple[float, float]:
        """(effective tokens, anneal done) of a val pass after `step` that had trained `tokens`: its own tokens x the
        mean lr / peak of its steps."""
        if step <= 0:
            return tokens, 0.0
        effective, anneal = self.planned
        step = min(step, self.total_steps)
        return tokens * float(effective[step]) / (self.tokens_per_step * step), float(anneal[step])

    def at_tokens(self, tokens: float) -> tuple[float, float]:
        """(effective tokens, anneal done) of a checkpoint at `tokens`: the planned run's up to its end, beyond it a
        longer run's end (the recipe's schedule stretched to those tokens: mean_multiplier x tokens, annealed)."""
        import numpy as np

        if tokens >= self.planned_tokens:
            return tokens * self.mean_multiplier, self.end_anneal
        effective, anneal = self.planned
        step, steps = tokens / self.tokens_per_step, np.arange(len(effective))
        return float(np.interp(step, steps, effective)), float(np.interp(step, steps, anneal))

    @cached_property
    def mean_multiplier(self) -> float:
        """The mean lr / peak over a run of this recipe: a run of N tokens trains this x N effective tokens."""
        return float(self.multipliers().mean())

    @cached_property
    def end_anneal(self) -> float:
        """1 - lr / peak of a run's last step (about 1 for cosine and linear, 0 for constant)."""
        return float(1.0 - self.multipliers()[-1])


def schedule_of(path: Path, config: dict[str, Any], summary: Any, tokens: float, steps: int) -> Schedule | None:
    """The planned run's schedule (see the module's docstring), with `tokens` trained in `steps` so far; None where
    the run's config or dir do not say it."""
    kind = config.get("optim.scheduler")
    warmup = config.get("optim.warmup_ratio", 0.0)
    if kind not in KINDS or not isinstance(warmup, int | float) or steps <= 0 or tokens <= 0:
        return None
    total, source = planned_steps(path, config, summary)
    if total is None or total < steps:
        return None
    return Schedule(str(kind), float(warmup), total, tokens / steps, source)


def planned_steps(path: Path, config: dict[str, Any], summary: Any) -> tuple[int | None, str]:
    if summary is not None and getattr(summary, "steps", None):
        return int(summary.steps), "summary.json"
    log = path / "launch.log"
    if log.is_file():
        found = STEPS_LINE.findall(log.read_text(errors="replace"))
        if found:
            return int(found[-1]), "launch.log"
    max_steps = config.get("optim.max_steps")
    if isinstance(max_steps, int) and max_steps > 0:
        return max_steps, "optim.max_steps"
    return None, ""
