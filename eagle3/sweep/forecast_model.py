"""The model eagle3.sweep.forecast extrapolates with: the fitted curve (eagle3.sweep.curve_fit), the ratio that
carries tau_sim to measured accept_len, and, where the run's lr schedule is known (eagle3.sweep.schedule), where a
checkpoint at given tokens sits on it: the planned run's effective tokens and anneal up to its end, beyond it the
end of a longer run of the same recipe."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eagle3.sweep.curve_fit import Curve, Fit
from eagle3.sweep.schedule import Schedule

FORM = "tau_sim(t) = a - b * (t / t_ref) ** -c"
FORM_ANNEALED = "tau_sim(t) = a - b * ((t / t_ref) ** -c - r * c * u), t: effective tokens, u: anneal done"


@dataclass
class Model:
    """accept_len = ratio * tau_sim, its refits each with a ratio drawn from the measured ones. With a schedule,
    tau_sim is the curve at effective tokens (tokens x lr / peak, summed) and the anneal done (u = 1 - lr / peak):
    along the planned run up to its end, and beyond it at the end of a longer run of the same recipe (its schedule
    stretched: mean_multiplier x tokens effective, fully annealed)."""

    fit: Fit
    ratio: float
    ratios: list[float]
    schedule: Schedule | None = None
    sources: list[str] = field(default_factory=list)
    ceiling: float = math.inf   # 1 + k: tau_sim cannot pass it

    def where(self, tokens: float) -> tuple[float, float]:
        """(effective tokens, anneal done) of a checkpoint at `tokens` (the planned run's, or a longer run's end)."""
        return (tokens, 0.0) if self.schedule is None else self.schedule.at_tokens(tokens)

    def point_where(self, step: int, tokens: float) -> tuple[float, float]:
        """(effective tokens, anneal done) of a val pass after `step` that had trained `tokens`."""
        return (tokens, 0.0) if self.schedule is None else self.schedule.at_point(step, tokens)

    def value(self, curve: Curve, tokens: float) -> float:
        return curve(*self.where(tokens))

    def accept(self, tokens: float) -> float:
        return self.ratio * self.value(self.fit.curve, tokens)

    def accept_band(self, tokens: float) -> tuple[float, float]:
        return self.fit.band([r * self.value(c, tokens) for r, c in zip(self.ratios, self.fit.refits)])

    def crossing(self, curve: Curve, y: float) -> float:
        """The tokens at which tau_sim first reaches y: along the planned run, else the length of a longer run of
        the recipe that ends there (inf: none does)."""
        import numpy as np

        s = self.schedule
        if s is None:
            return curve.tokens_to(y)
        effective, anneal = s.planned
        steps = np.arange(1, s.total_steps + 1)
        with np.errstate(divide="ignore"):   # a first warmup step trains at lr 0: no effective tokens yet
            values = curve.a - curve.b * ((effective[1:] / curve.t_ref) ** -curve.c
                                          - curve.r * curve.c * anneal[1:])
        above = np.nonzero(values >= y)[0]
        if len(above):
            i = int(above[0])
            if i == 0:
                return float(s.tokens_per_step)
            v0, v1 = values[i - 1], values[i]
            return float((steps[i - 1] + (y - v0) / (v1 - v0)) * s.tokens_per_step)
        return max(curve.tokens_to(y, s.end_anneal) / s.mean_multiplier, s.planned_tokens)

    def tokens_to(self, accept_len: float) -> float:
        return self.crossing(self.fit.curve, accept_len / self.ratio)

    def tokens_band(self, accept_len: float) -> tuple[float, float]:
        return self.fit.band([self.crossing(c, accept_len / r) for r, c in zip(self.ratios, self.fit.refits)])

    def asymptote(self, curve: Curve, ratio: float) -> float:
        """accept_len the recipe tends to with more tokens (annealed at the end where the schedule anneals)."""
        u = self.schedule.end_anneal if self.schedule is not None else 0.0
        return ratio * min(curve.a + curve.gain * u, self.ceiling)
