"""Will a recipe pay off, and when: acceptance forecast against trained tokens from a run's val passes.

A run's val rows give tau_sim against the tokens trained so far (each val row records them; a run dir written
before they did gets them from summary.json's tokens per step). eagle3.sweep.curve_fit fits a power law rising to
an asymptote to them, and the fit is carried to measured acceptance by the mean ratio accept_len / tau_sim over
the points where the run's checkpoints were measured (eval.accept in the run, accept_k<k>.json, eagle3.serve's
serve_vllm_k<k>_t0.json). From it: the accept_len expected at token budgets (2x, 10x, 100x the tokens so far, and
any asked), the tokens and hours to reach a target and to pass the n-gram baseline, and the serving speedup
eagle3.eval.speedup's model predicts at those acceptances; each with a 90% bootstrap interval (over the fit's
residuals and the measured ratios). Where the run's lr schedule and planned steps are known (eagle3.sweep.schedule)
the curve is fitted against effective tokens (tokens x lr / peak) with an anneal term (what lowering the lr gains,
r x the curve's slope per e-fold x the anneal done, r from a prior the points update), and followed along the planned
run to its end, beyond it to the ends of longer runs of the recipe. The report is a plain dict (`forecast_run`);
`format_report` prints it.
No argparse here: eagle3/cli/forecast.py is the command.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from eagle3.errors import ForecastError
from eagle3.sweep.curve_fit import PARAMETERS, Fit, fit_curve
from eagle3.sweep.forecast_model import FORM, FORM_ANNEALED, Model
from eagle3.sweep.schedule import Schedule, schedule_of

MIN_POINTS = PARAMETERS + 1   # val passes after step 0 the curve needs
MIN_RISE = 0.02               # tau_sim above its start the curve must have risen
BUDGETS = (2.0, 10.0, 100.0)  # the budgets always forecast, as multiples of the tokens so far
# the anneal term's r (its gain over a full anneal, in the curve's slopes per e-fold of tokens): mean and sd.
# Calibrated on the SmolLM2 reference runs (docs/forecast.md, "The schedule"); --anneal-prior sets another.
ANNEAL_PRIOR = (2.1, 1.0)


class RunLike(Protocol):
    """What a forecast reads of a run (eagle3.sweep.compare.Run has it)."""

    path: Path
    config: dict[str, Any]        # flattened resolved config
    summary: Any                  # eagle3.rundir.progress.RunSummary or None
    val_rows: list[dict[str, Any]]

    @property
    def label(self) -> str: ...


@dataclass
class Options:
    target: float | None = None            # accept_len to reach
    ngram: float | None = None             # the n-gram baseline's accept_len (default: the run's serve report)
    at: list[float] = field(default_factory=list)   # token budgets asked for
    until_step: int | None = None          # use only the val passes up to this step
    until_tokens: float | None = None      # or up to these tokens
    tokens_per_s: float | None = None      # training rate for the hours (default: the run's measured one)
    costs: dict[str, float] | None = None  # baseline_ms, verify_ms, draft_ms for the speedup (default: served)
    horizon: float = 1000.0                # "not within N tokens": N = horizon x the tokens so far
    bootstrap: int = 400
    seed: int = 0
    anneal_prior: tuple[float, float] = ANNEAL_PRIOR


@dataclass
class Point:
    step: int
    tokens: float
    tau_sim: float
    accept_len: float | None = None        # measured at this step (the run's eval.accept, reports of its checkpoints)
    source: str | None = None


# --- the points ------------------------------------------------------------------------------------------------

def points_of(run: RunLike) -> list[Point]:
    """The run's val passes in step order (a resumed run's replayed step: its last row), with tokens trained."""
    by_step: dict[int, dict[str, Any]] = {}
    for row in run.val_rows:
        by_step[int(row["step"])] = row
    rows = [by_step[s] for s in sorted(by_step)]
    per_step = None
    if any("tokens" not in r for r in rows):
        s = run.summary
        if s is None or not s.steps:
            raise ForecastError(f"{run.path}: its val rows do not record the tokens trained (written before eagle3 "
                                "logged them) and it has no summary.json to count them from; finish or resume it "
                                "with this version")
        per_step = s.tokens / s.steps  # an estimate: every step trains about the same tokens
    k = ttt_steps(run)
    measured_in_run = run.config.get("eval.accept.k") in (None, k)
    points = []
    for r in rows:
        tokens = float(r["tokens"]) if per_step is None else per_step * int(r["step"])
        accept = r.get("accept_len") if measured_in_run else None
        points.append(Point(int(r["step"]), tokens, float(r["tau_sim"]), accept,
                            "eval.accept in the run" if accept is not None else None))
    for step, accept, source in report_measurements(run, k):
        for p in points:
            if p.step == step and p.accept_len is None:
                p.accept_len, p.source = accept, source
    return points


def ttt_steps(run: RunLike) -> int:
    """The draft length tau_sim counts (the run's model.draft.ttt_steps; 3 where the config does not say)."""
    k = run.config.get("model.draft.ttt_steps")
    return int(k) if isinstance(k, int) else 3


def report_measurements(run: RunLike, k: int) -> list[tuple[int, float, str]]:
    """(step, accept_len, file) of the run's greedy reports at k of its best or last checkpoint: eval.accept's
    accept_k<k>.json and eagle3.serve's serve_vllm_k<k>_t0.json (not those flagged implausible)."""
    if run.summary is None:
        return []
    steps = {"best": run.summary.best.get("step"), "last": run.summary.final.get("step")}
    found = []
    for file in [run.path / f"accept_k{k}.json", run.path / f"serve_vllm_k{k}_t0.json"]:
        report = read_json(file)
        if not report or report.get("implausible") or not isinstance(report.get("accept_len"), int | float):
            continue
        which = Path(str(report.get("checkpoint", ""))).name
        if report.get("temperature", 0) == 0 and steps.get(which) is not None:
            found.append((int(steps[which]), float(report["accept_len"]), file.name))
    return found


def read_json(file: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def ngram_of(run: RunLike) -> tuple[float, str] | None:
    """The n-gram baseline's accept_len eagle3.serve measured beside the run (at its k if served there)."""
    k = ttt_steps(run)
    files = sorted(run.path.glob("serve_vllm_k*_t0.json"), key=lambda f: f.name != f"serve_vllm_k{k}_t0.json")
    for file in files:
        ngram = (read_json(file) or {}).get("ngram")
        if isinstance(ngram, dict) and isinstance(ngram.get("accept_len"), int | float):
            return float(ngram["accept_len"]), f"{file.name} (k={ngram.get('k')})"
    return None


def tokens_per_s_of(run: RunLike) -> float | None:
    """The run's measured training rate: summary.json's, else its latest train row's."""
    if run.summary is not None and run.summary.tokens_per_s:
        return float(run.summary.tokens_per_s)
    metrics = run.path / "metrics.jsonl"
    rate = None
    if metrics.is_file():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("split") == "train" and row.get("tokens_per_s"):
                rate = float(row["tokens_per_s"])
    return rate


# --- the refusals ----------------------------------------------------------------------------------------------

def check_points(run: RunLike, used: list[Point]) -> None:
    """Too few val passes, or a curve that has not left its start: refused, with the steps it needs."""
    fitted = [p for p in used if p.tokens > 0]
    spacing = val_spacing(run, used)
    if len(fitted) < MIN_POINTS:
        more = MIN_POINTS - len(fitted)
        raise ForecastError(f"{run.path}: {len(fitted)} val passes after step 0, a forecast needs {MIN_POINTS}: "
                            f"train {more} more (about {more * spacing} more steps at a val pass every {spacing}; "
                            "optim.eval_every sets how often)")
    start = used[0].tau_sim
    rise = max(p.tau_sim for p in fitted) - start
    if rise < MIN_RISE:
        last = used[-1]
        slope = (last.tau_sim - start) / max(last.step - used[0].step, 1)
        steps = math.ceil((MIN_RISE - rise) / slope) if slope > 0 else max(last.step, spacing)
        raise ForecastError(f"{run.path}: tau_sim has not left its start ({start:.4f} at step {used[0].step}, "
                            f"{rise:+.4f} by step {last.step}; a forecast needs a rise of {MIN_RISE}): train about "
                            f"{max(steps, spacing)} more steps first, or check the recipe (a flat curve at this "
                            "lr may never rise)")


def val_spacing(run: RunLike, points: list[Point]) -> int:
    every = run.config.get("optim.eval_every")
    if isinstance(every, int) and every > 0:
        return every
    gaps = sorted(b.step - a.step for a, b in zip(points, points[1:]) if b.step > a.step)
    return gaps[len(gaps) // 2] if gaps else 1


def cut(points: list[Point], options: Options) -> list[Point]:
    return [p for p in points
            if (options.until_step is None or p.step <= options.until_step)
            and (options.until_tokens is None or p.tokens <= options.until_tokens)]


# --- the forecast ----------------------------------------------------------------------------------------------

def ratio_of(used: list[Point], refits: int, seed: int) -> tuple[float, list[float], list[str]]:
    """The mean measured accept_len / tau_sim over the measured points (1.0 where none is), one resampled mean per
    refit, and the points' sources."""
    import numpy as np

    measured = [p for p in used if p.accept_len is not None]
    if not measured:
        return 1.0, [1.0] * refits, []
    ratios = np.array([p.accept_len / p.tau_sim for p in measured])  # type: ignore[operator]
    rng = np.random.default_rng(seed + 1)
    draws = rng.choice(ratios, size=(refits, len(ratios)), replace=True).mean(axis=1)
    return float(ratios.mean()), [float(d) for d in draws], sorted({str(p.source) for p in measured})


def forecast_run(run: RunLike, options: Options) -> dict[str, Any]:
    """The forecast of one run as a plain dict (see the module's docstring); ForecastError where it cannot be made."""
    points = points_of(run)
    used = cut(points, options)
    if not used:
        raise ForecastError(f"{run.path}: no val pass up to {until_text(options)}")
    check_points(run, used)
    fitted = [p for p in used if p.tokens > 0]
    k = ttt_steps(run)
    schedule = schedule_of(run.path, run.config, run.summary, fitted[-1].tokens, fitted[-1].step)
    model = fit_model(used, fitted, schedule, k, options)
    fit = model.fit
    so_far = fitted[-1].tokens
    horizon = options.horizon * so_far
    budgets = sorted({*(m * so_far for m in BUDGETS), *options.at})
    planned = schedule is not None and schedule.planned_tokens > so_far * 1.0001
    if planned:
        assert schedule is not None
        budgets = sorted({*budgets, schedule.planned_tokens})
    tps = options.tokens_per_s or tokens_per_s_of(run)
    speedup = Speedup.of(run, used[-1].step, options.costs)
    ngram = (options.ngram, "given") if options.ngram is not None else ngram_of(run)
    goals = [("target", options.target, "given")] if options.target is not None else []
    if ngram is not None:
        goals.append(("n-gram", ngram[0], ngram[1]))
    curve, ratio, ratios = fit.curve, model.ratio, model.ratios
    return {
        "run": str(run.path), "label": run.label, "k": k, "until": until_text(options),
        "step": used[-1].step, "tokens_so_far": so_far, "tokens_per_s": tps, "horizon_tokens": horizon,
        "points": [point_dict(p, model) for p in used],
        "later": [point_dict(p, model) for p in points if p not in used],
        "curve": {"form": FORM_ANNEALED if schedule else FORM, "a": curve.a, "b": curve.b, "c": curve.c,
                  "t_ref": curve.t_ref, "r": curve.r, "gain": curve.gain, "rms": fit.rms,
                  "asymptote_accept_len": model.asymptote(curve, ratio),
                  "asymptote_band": list(fit.band([model.asymptote(c, r) for r, c in zip(ratios, fit.refits)])),
                  # a at 1 + k: the points do not bend yet, the asymptote is not known from them
                  "asymptote_at_ceiling": curve.a >= k + 1.0 - 1e-6},
        "schedule": schedule_dict(schedule, options, fit),
        "ratio": {"value": ratio, "measured_points": sum(p.accept_len is not None for p in used),
                  "sources": model.sources},
        "speedup_costs": speedup.source if speedup else None,
        "at": [budget_dict(t, model, speedup) for t in budgets],
        "planned_end": budget_dict(schedule.planned_tokens, model, speedup) | {"steps": schedule.total_steps}
        if planned and schedule is not None else None,
        "band": [dict(zip(("tokens", "accept_len", "low", "high"), (t, model.accept(t), *model.accept_band(t))))
                 for t in geometric(fitted[0].tokens, max(budgets), 40)],
        "reach": [goal_dict(name, value, source, model, used, so_far, horizon, tps, speedup)
                  for name, value, source in goals],
    }


def fit_model(used: list[Point], fitted: list[Point], schedule: Schedule | None, k: int, options: Options) -> Model:
    """The curve through the fitted points (with the anneal term where the schedule is known) and the ratio."""
    where = [(p.tokens, 0.0) if schedule is None else schedule.at_point(p.step, p.tokens) for p in fitted]
    anneal = [u for _, u in where] if schedule is not None else None
    fit = fit_curve([x for x, _ in where], [p.tau_sim for p in fitted], ceiling=1.0 + k, bootstrap=options.bootstrap,
                    seed=options.seed, anneal=anneal, prior=options.anneal_prior if anneal is not None else None)
    ratio, ratios, sources = ratio_of(used, len(fit.refits), options.seed)
    return Model(fit, ratio, ratios, schedule, sources, 1.0 + k)


def schedule_dict(schedule: Schedule | None, options: Options, fit: Fit) -> dict[str, Any] | None:
    if schedule is None:
        return None
    return {"kind": schedule.kind, "warmup_ratio": schedule.warmup_ratio, "total_steps": schedule.total_steps,
            "source": schedule.source, "tokens_per_step": schedule.tokens_per_step,
            "planned_tokens": schedule.planned_tokens, "mean_multiplier": schedule.mean_multiplier,
            "anneal_prior": list(options.anneal_prior),
            "gain_band": list(fit.band([c.gain for c in fit.refits]))}


def geometric(start: float, end: float, n: int) -> list[float]:
    return [start * (end / start) ** (i / (n - 1)) for i in range(n)]


def until_text(options: Options) -> str:
    parts = ([f"step {options.until_step}"] if options.until_step is not None else []) + (
        [f"{tokens_text(options.until_tokens)} tokens"] if options.until_tokens is not None else [])
    return " and ".join(parts) or "the end"


def point_dict(p: Point, model: Model) -> dict[str, Any]:
    fitted = model.ratio * model.fit.curve(*model.point_where(p.step, p.tokens)) if p.tokens > 0 else None
    return {"step": p.step, "tokens": p.tokens, "tau_sim": p.tau_sim, "accept_len": p.accept_len,
            "source": p.source, "fitted_accept_len": fitted}


def budget_dict(tokens: float, model: Model, speedup: Speedup | None) -> dict[str, Any]:
    low, high = model.accept_band(tokens)
    out = {"tokens": tokens, "accept_len": model.accept(tokens), "low": low, "high": high}
    if speedup is not None:
        out["speedup"] = speedup.at(out["accept_len"])
    return out


def goal_dict(name: str, value: float, source: str, model: Model, used: list[Point], so_far: float, horizon: float,
              tps: float | None, speedup: Speedup | None) -> dict[str, Any]:
    """Tokens (and hours) to reach accept_len `value`: where a point already did (measured, else the fit's value
    at a point), else the fit's crossing with its band; within: the crossing is within the horizon."""
    out: dict[str, Any] = {"name": name, "accept_len": value, "source": source}
    reached = next((p for p in used if p.tokens > 0 and (p.accept_len if p.accept_len is not None
                                                         else model.ratio * p.tau_sim) >= value), None)
    if reached is not None:
        tokens, low, high = reached.tokens, reached.tokens, reached.tokens
        out["reached_at_step"] = reached.step
    else:
        tokens, (low, high) = model.tokens_to(value), model.tokens_band(value)
    out["within"] = tokens <= horizon
    out.update({"tokens": finite(tokens), "low": finite(low), "high": finite(high)})
    out["never"] = value >= model.asymptote(model.fit.curve, model.ratio)   # the fitted asymptote stays below it
    if tps:
        out["tokens_per_s"] = tps
        for key, t in (("hours", tokens), ("hours_low", low), ("hours_high", high)):
            out[key] = finite(max(t - so_far, 0.0) / tps / 3600.0)
    if speedup is not None:
        out["speedup"] = speedup.at(value)
    return out


def finite(x: float) -> float | None:
    """JSON has no infinity: None for a value that is not finite (a refit that never gets there)."""
    return x if math.isfinite(x) else None


# --- the predicted serving speedup at an acceptance (eagle3.eval.speedup's model) -------------------------------

@dataclass
class Speedup:
    """The speedup eagle3.eval.speedup.predict gives at an accept_len: the run's per-position rate shape (its val
    full_acc_*) scaled to that accept_len, at step costs given or measured by eagle3.serve beside the run."""

    shape: list[float]
    costs: Any               # eagle3.eval.speedup.StepCosts
    only_k: int | None       # served costs hold one k: the speedup at it
    source: str

    @classmethod
    def of(cls, run: RunLike, step: int, given: dict[str, float] | None) -> Speedup | None:
        from eagle3.eval.speedup import StepCosts

        row: dict[str, Any] = next((r for r in reversed(run.val_rows) if r["step"] == step), {})
        shape = [float(row[f"full_acc_{j}"]) for j in range(len(row)) if f"full_acc_{j}" in row]
        if not shape or sum(shape) <= 0:
            return None
        if given is not None:
            ks = range(1, len(shape) + 1)
            return cls(shape, StepCosts(given["baseline_ms"], dict.fromkeys(ks, given["verify_ms"]),
                                        given.get("draft_ms", 0.0)), None, "given step costs")
        k = ttt_steps(run)
        report = read_json(run.path / f"serve_vllm_k{k}_t0.json")
        if not report or report.get("implausible") or not report.get("speedup") or len(shape) < k:
            return None
        try:
            plain_ms = 1000.0 / float(report["plain_tokens_per_s"])
            step_ms = plain_ms * float(report["accept_len"]) / float(report["speedup"])
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
        return cls(shape[:k], StepCosts(plain_ms, dict.fromkeys(range(1, k + 1), step_ms), 0.0), k,
                   f"serve_vllm_k{k}_t0.json's served step at k={k}")

    def at(self, accept_len: float) -> float:
        from eagle3.eval.speedup import predict

        scale = max(accept_len - 1.0, 0.0) / sum(self.shape)
        prediction = predict([min(1.0, r * scale) for r in self.shape], self.costs)
        row = prediction["rows"][self.only_k - 1] if self.only_k else prediction["rows"][prediction["best_k"] - 1]
        return float(row["speedup"])


# --- several runs, and the text ---------------------------------------------------------------------------------

def rank_reports(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """By the tokens to the target (else to n-gram): fewest first; then the runs that do not get there within their
    horizon, then those without the goal (no n-gram served), each by accept_len at the end of its planned run where
    every run is a pilot of a planned run (which recipe ends best), else at 10x their tokens so far."""
    by_end = all(r.get("planned_end") for r in reports)

    def key(report: dict[str, Any]) -> tuple[int, float]:
        goals = report["reach"]
        if goals and goals[0]["within"] and goals[0]["tokens"] is not None:
            return (0, goals[0]["tokens"])
        if by_end:
            return (1 if goals else 2, -report["planned_end"]["accept_len"])
        at10 = next(a for a in report["at"] if math.isclose(a["tokens"], 10 * report["tokens_so_far"]))
        return (1 if goals else 2, -at10["accept_len"])
    return sorted(reports, key=key)


def tokens_text(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "never"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.0f}"
