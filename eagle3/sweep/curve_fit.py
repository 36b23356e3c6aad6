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
    """y(t, u) = a - b * ((t / t_ref) ** -c - r * c * u); r = 0 (no anneal term) unless fitted with one."""

    a: float
    b: float
    c: float
    t_ref: float
    r: float = 0.0

    def __call__(self, tokens: float, anneal: float = 0.0) -> float:
        return self.a - self.b * ((tokens / self.t_ref) ** -self.c - self.r * self.c * anneal)

    @property
    def gain(self) -> float:
        """What a full anneal (u = 1) adds: r x the curve's slope per e-fold of tokens at t_ref (b c)."""
        return self.r * self.b * self.c

    def tokens_to(self, y: float, anneal: float = 0.0) -> float:
        """The tokens at which the curve (at anneal u) reaches y; inf where it never does (y at or above its
        asymptote a + gain x u)."""
        top = self.a + self.gain * anneal
        if y >= top:
            return math.inf
        if self.b <= 0:
            return 0.0
        return self.t_ref * ((top - y) / self.b) ** (-1.0 / self.c)


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
              bootstrap: int = 400, seed: int = 0, anneal: Sequence[float] | None = None,
              prior: tuple[float, float] | None = None) -> Fit:
    """The curve through (tokens, values) (tokens > 0, more than PARAMETERS points), with `bootstrap` refits.
    With `anneal` (u at each point) and `prior` (r's mean and sd): the anneal term's r too, see fit_anneal."""
    import numpy as np

    t = np.asarray(tokens, dtype=float)
    y = np.asarray(values, dtype=float)
    if len(t) <= PARAMETERS or np.any(t <= 0):
        raise ValueError(f"a curve needs more than {PARAMETERS} points at tokens > 0, got {len(t)}")
    if anneal is not None and prior is not None:
        return fit_anneal(t, y, np.asarray(anneal, dtype=float), prior, ceiling, floor, bootstrap, seed)
    t_ref = float(t.max())
    x = t / t_ref
    (a, b, c), = least_squares(x, y[None, :], ceiling, floor)
    # and again on a fine grid around it (0.01 % in c): the extrapolation far out is sensitive to c
    (a, b, c), = least_squares(x, y[None, :], ceiling, floor, fine_grid(c))
    curve = Curve(a, b, c, t_ref)
    fitted = np.array([curve(v) for v in t])
    residuals = y - fitted
    y_star = fitted[None, :] + resampled(residuals, bootstrap, seed)
    refits = [Curve(*p, t_ref) for p in least_squares(x, y_star, ceiling, floor)]
    return Fit(curve, refits, float(np.sqrt(np.mean(residuals ** 2))))


def fine_grid(c: float) -> Any:
    import numpy as np

    return np.clip(np.geomspace(c / 1.03, c * 1.03, 301), *C_BOUNDS)


def resampled(residuals: Any, bootstrap: int, seed: int) -> Any:
    """(bootstrap, n) residuals drawn with replacement, scaled up by sqrt(n / (n - PARAMETERS))."""
    import numpy as np

    n = len(residuals)
    rng = np.random.default_rng(seed)
    return rng.choice(residuals * math.sqrt(n / (n - PARAMETERS)), size=(bootstrap, n), replace=True)


R_GRID = 25           # values of r the anneal fit tries: the prior's mean +- 3 sd
NOISE_FLOOR = 0.003   # the least noise a val pass's value is taken to have (its tau_sim, 3 decimals)


def fit_anneal(t: Any, y: Any, u: Any, prior: tuple[float, float], ceiling: float, floor: float, bootstrap: int,
               seed: int) -> Fit:
    """y = a - b ((t / t_ref)^-c - r c u), r on a grid over the prior's mean +- 3 sd: for each r the least squares
    in (a, b, c), its cost sse / sigma^2 + (r - mean)^2 / sd^2 (sigma: the points' noise, from the fit at the
    prior's mean); the curve: the r of least cost. Where the points hold no anneal (u about constant) the cost is
    the prior's and r stays at its mean; where they do, they move it. Each refit draws its r from the grid with
    probability exp(-cost / 2) (the prior updated by the points) and adds resampled residuals: the band holds both
    the points' noise and what is not known of r."""
    import numpy as np

    mean, sd = prior
    t_ref = float(t.max())
    x = t / t_ref
    grid = np.unique(np.clip(mean + sd * np.linspace(-3.0, 3.0, R_GRID), 0.0, None))
    fits = [solve(x, y[None, :], ceiling, floor, anneal=u, r=r) for r in grid]
    sse = np.array([float(f[3][0]) for f in fits])
    sigma2 = max(float(sse[np.argmin(abs(grid - mean))]) / (len(t) - PARAMETERS), NOISE_FLOOR ** 2)
    cost = sse / sigma2 + (grid - mean) ** 2 / sd ** 2
    g = int(cost.argmin())
    r = float(grid[g])
    a, b, c, _ = (float(v[0]) for v in solve(x, y[None, :], ceiling, floor, fine_grid(float(fits[g][2][0])), u, r))
    curve = Curve(a, b, c, t_ref, r)
    fitted = np.array([curve(ti, ui) for ti, ui in zip(t, u)])
    residuals = y - fitted
    y_star = fitted[None, :] + resampled(residuals, bootstrap, seed)
    weights = np.exp(-(cost - cost.min()) / 2)
    draws = np.random.default_rng(seed + 2).choice(len(grid), size=bootstrap, p=weights / weights.sum())
    refits: list[Curve | None] = [None] * bootstrap
    for i in np.unique(draws):
        rows = np.nonzero(draws == i)[0]
        a_i, b_i, c_i, _ = solve(x, y_star[rows], ceiling, floor, anneal=u, r=float(grid[i]))
        for j, row in enumerate(rows):
            refits[row] = Curve(float(a_i[j]), float(b_i[j]), float(c_i[j]), t_ref, float(grid[i]))
    return Fit(curve, [c for c in refits if c is not None], float(np.sqrt(np.mean(residuals ** 2))))


def least_squares(x: Any, ys: Any, ceiling: float, floor: float, c_values: Any = None,
                  anneal: Any = None, r: float = 0.0) -> list[tuple[float, float, float]]:
    """(a, b, c) of least squared error for each row of ys (values at x), floor <= a <= ceiling, b >= 0, c within
    C_BOUNDS. For a given c the curve is linear in (a, b), so each c of a log-spaced grid is solved exactly (the
    unconstrained solution, or the best on the edges a = floor, a = ceiling, b = 0 where it breaks a bound) and the
    c of least error kept: the global least squares up to the grid's spacing (default: 400 values, 2 % apart in
    c), with no start to choose. With `anneal` (u at each x) the curve is a - b (x^-c - r c u) for the given r."""
    a, b, c, _ = solve(x, ys, ceiling, floor, c_values, anneal, r)
    return [(float(ai), float(bi), float(ci)) for ai, bi, ci in zip(a, b, c)]


def solve(x: Any, ys: Any, ceiling: float, floor: float, c_values: Any = None, anneal: Any = None,
          r: float = 0.0) -> tuple[Any, Any, Any, Any]:
    """least_squares' (a, b, c) as arrays over the rows of ys, with each row's squared error."""
    import numpy as np

    c = np.geomspace(*C_BOUNDS, 400) if c_values is None else np.asarray(c_values)
    z = x[None, :] ** -c[:, None]                                    # (grid, n)
    if anneal is not None and r:
        z = z - r * c[:, None] * anneal[None, :]
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
    y2, yz, z2, z1 = (ys ** 2).sum(axis=1)[:, None], ys @ z.T, (z ** 2).sum(axis=1)[None, :], z.sum(axis=1)[None, :]
    ysum = ys.sum(axis=1)[:, None]
    best_sse, best_a, best_b = None, None, None
    for a, b in candidates:
        feasible = (a >= floor - 1e-12) & (a <= ceiling + 1e-12) & (b >= 0)
        # sum((a - b z - y)^2), expanded: no (rows, grid, n) array
        sse = n * a ** 2 + b ** 2 * z2 + y2 - 2 * a * b * z1 - 2 * a * ysum + 2 * b * yz
        sse = np.where(feasible, np.maximum(sse, 0.0), np.inf)
        if best_sse is None:
            best_sse, best_a, best_b = sse, a, b
        else:
            better = sse < best_sse
            best_sse = np.where(better, sse, best_sse)
            best_a, best_b = np.where(better, a, best_a), np.where(better, b, best_b)
    assert best_sse is not None and best_a is not None and best_b is not None
    pick = best_sse.argmin(axis=1)
    rows = np.arange(ys.shape[0])
    return best_a[rows, pick], best_b[rows, pick], c[pick], best_sse[rows, pick]
