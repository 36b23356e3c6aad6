"""The learning curve eagle3.sweep.forecast extrapolates: acceptance against trained tokens, a power law rising
towards an asymptote,

    y(t) = a - b * (t / t_ref) ** -c          a: the asymptote, b >= 0: how far below it the curve is at t_ref
                                              (the last point's tokens), c > 0: how fast the gap closes

fitted by least squares (numpy), with a <= the curve's ceiling (1 + the draft length for tau_sim: every draft
token accepted). Small c with a high a is the straight line in log-tokens that a young curve shows (a - b + b c
ln(t/t_ref) for small c ln(t/t_ref)); the ceiling keeps an extrapolation from running off along it. The band is a
residual bootstrap: the fit's residuals (scaled up by sqrt(n / (n - 3)) for the three fitted parameters) added back
to the fitted curve in resampled order, the curve fitted again each time; a value's interval is the 5th and 95th
percentile of the refitted curves' values. numpy is imported when a curve is fitted, not before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

PARAMETERS = 3
LOW_Q, HIGH_Q = 5.0, 95.0   # the band: a 90% interval
C_BOUNDS = (1e-3, 5.0)   # the rates c the fit tries (log-spaced)


@dataclass(frozen=True)
class Curve:
    """y(t) = a - b * (t / t_ref) ** -c."""

    a: float
    b: float
    c: float
    t_ref: float

    def __call__(self, tokens: float) -> float:
        return self.a - self.b * (tokens / self.t_ref) ** -self.c

    def tokens_to(self, y: float) -> float:
        """The tokens at which the curve reaches y; inf where it never does (y at or above the asymptote)."""
        if y >= self.a:
            return math.inf
        if self.b <= 0:
            return 0.0
        return self.t_ref * ((self.a - y) / self.b) ** (-1.0 / self.c)


@dataclass
class Fit:
    """The fitted curve, its bootstrap refits (the band) and the residuals' root mean square."""

    curve: Curve
    refits: list[Curve] = field(default_factory=list)
    rms: float = 0.0

    def band(self, values: Sequence[float]) -> tuple[float, float]:
        """(low, high) percentiles of values, one per refit (inf allowed: a refit that never gets there)."""
        import numpy as np

        if not values:
            return (math.nan, math.nan)
        # inverted_cdf: an order statistic, so a refit that never gets there (inf) is a bound, not a nan
        low, high = np.percentile(np.asarray(values, dtype=float), [LOW_Q, HIGH_Q], method="inverted_cdf")
        return float(low), float(high)

    def value_band(self, tokens: float) -> tuple[float, float]:
        return self.band([c(tokens) for c in self.refits])

    def tokens_band(self, y: float) -> tuple[float, float]:
        return self.band([c.tokens_to(y) for c in self.refits])


def fit_curve(tokens: Sequence[float], values: Sequence[float], ceiling: float, floor: float = 1.0,
              bootstrap: int = 400, seed: int = 0) -> Fit:
    """The curve through (tokens, values) (tokens > 0, more than PARAMETERS points), with `bootstrap` refits."""
    import numpy as np

    t = np.asarray(tokens, dtype=float)
    y = np.asarray(values, dtype=float)
    if len(t) <= PARAMETERS or np.any(t <= 0):
        raise ValueError(f"a curve needs more than {PARAMETERS} points at tokens > 0, got {len(t)}")
    t_ref = float(t.max())
    x = t / t_ref
    (a, b, c), = least_squares(x, y[None, :], ceiling, floor)
    # and again on a fine grid around it (0.01 % in c): the extrapolation far out is sensitive to c
    (a, b, c), = least_squares(x, y[None, :], ceiling, floor, np.clip(np.geomspace(c / 1.03, c * 1.03, 301),
                                                                      *C_BOUNDS))
    curve = Curve(a, b, c, t_ref)
    fitted = np.array([curve(v) for v in t])
    residuals = y - fitted
    scaled = residuals * math.sqrt(len(t) / (len(t) - PARAMETERS))
    rng = np.random.default_rng(seed)
    y_star = fitted[None, :] + rng.choice(scaled, size=(bootstrap, len(t)), replace=True)
    refits = [Curve(*p, t_ref) for p in least_squares(x, y_star, ceiling, floor)]
    return Fit(curve, refits, float(np.sqrt(np.mean(residuals ** 2))))


def least_squares(x: Any, ys: Any, ceiling: float, floor: float,
                  c_values: Any = None) -> list[tuple[float, float, float]]:
    """(a, b, c) of least squared error for each row of ys (values at x), floor <= a <= ceiling, b >= 0, c within
    C_BOUNDS. For a given c the curve is linear in (a, b), so each c of a log-spaced grid is solved exactly (the
    unconstrained solution, or the best on the edges a = floor, a = ceiling, b = 0 where it breaks a bound) and the
    c of least error kept: the global least squares up to the grid's spacing (default: 400 values, 2 % apart in
    c), with no start to choose."""
    import numpy as np

    c = np.geomspace(*C_BOUNDS, 400) if c_values is None else np.asarray(c_values)
    z = x[None, :] ** -c[:, None]                                    # (grid, n)
    n = x.shape[0]
    zm, ym = z.mean(axis=1), ys.mean(axis=1)                          # (grid,), (rows,)
    zc = z - zm[:, None]
    cov = (ys - ym[:, None]) @ zc.T / n                               # (rows, grid)
    var = (zc ** 2).mean(axis=1)[None, :]
    candidates = []
    b_free = -cov / var                                              # y = a - b z
    candidates.append((ym[:, None] + b_free * zm[None, :], b_free))
    flat = np.clip(ym, floor, ceiling)[:, None] * np.ones_like(b_free)
    candidates.append((flat, np.zeros_like(b_free)))
    for edge in (floor, ceiling):                                    # a fixed: b = sum(z (a - y)) / sum(z^2)
        b_edge = np.clip((edge * z.sum(axis=1)[None, :] - ys @ z.T) / (z ** 2).sum(axis=1)[None, :], 0.0, None)
        candidates.append((np.full_like(b_edge, edge), b_edge))
    best_sse, best_a, best_b = None, None, None
    for a, b in candidates:
        feasible = (a >= floor - 1e-12) & (a <= ceiling + 1e-12) & (b >= 0)
        sse = ((a[:, :, None] - b[:, :, None] * z[None, :, :] - ys[:, None, :]) ** 2).sum(axis=2)
        sse = np.where(feasible, sse, np.inf)
        if best_sse is None:
            best_sse, best_a, best_b = sse, a, b
        else:
            better = sse < best_sse
            best_sse = np.where(better, sse, best_sse)
            best_a, best_b = np.where(better, a, best_a), np.where(better, b, best_b)
    assert best_sse is not None and best_a is not None and best_b is not None
    pick = best_sse.argmin(axis=1)
    rows = np.arange(ys.shape[0])
    return [(float(best_a[r, g]), float(best_b[r, g]), float(c[g])) for r, g in zip(rows, pick)]
