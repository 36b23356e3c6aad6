"""Step costs from a serving engine's reports (eagle3.serve's serve_vllm_k<k>_t<T>.json): the step fitted as
fixed + per_token * k plain steps, and the prediction held against the speedups the engine measured
(`eagle3 speedup --engine-costs`; eagle3/eval/speedup.py has the model)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import ConfigError
from eagle3.eval.speedup import StepCosts, format_prediction, predict

# Which speedup of an eagle3.serve report --clock takes: wall (all tokens over all request time), median (of the
# per-prompt ratios), cpu (the servers' CPU time).
SERVED_SPEEDUP = {"wall": "speedup", "median": "speedup_median", "cpu": "speedup_cpu"}


@dataclass
class ServedStep:
    """One eagle3.serve report as the engine's step-cost fit reads it: k, its step in plain steps
    (accept_len / speedup: the tokens one step makes over the tokens one plain step makes in its time), the
    plain step in ms, and what must agree between reports fitted together."""

    k: int
    plain_steps: float
    plain_ms: float
    setup: tuple[Any, ...]  # engine, version, dtype
    run: tuple[Any, ...]    # checkpoint, verifier, temperature: the served run
    path: Path
    speedup: float
    accept_len: float
    draft_ms: float | None = None  # the draft forward eagle3.serve timed between the requests (`clock`'s time)


def served_step(path: Path, clock: str) -> ServedStep:
    if not path.is_file():
        raise ConfigError(f"--engine-costs: {path} does not exist or is not a file")
    try:
        r = json.loads(path.read_text())
        k, accept_len = int(r["k"]), float(r["accept_len"])
        speedup = float(r[SERVED_SPEEDUP[clock]])
        plain = float(r["plain_tokens_per_cpu_s" if clock == "cpu" else "plain_tokens_per_s"])
        temperature = r["temperature"]
        if isinstance(temperature, bool) or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(temperature)
        timed_draft = r.get("draft_forward_ms")  # reports written before eagle3.serve timed the draft lack it
        draft_ms = None if timed_draft is None else float(timed_draft["cpu" if clock == "cpu" else "wall"])
        if draft_ms is not None and not (math.isfinite(draft_ms) and draft_ms > 0):
            raise ValueError(draft_ms)
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"--engine-costs: {path} is not an eagle3 serve report (serve_vllm_k*_t*.json)") from None
    if not (speedup > 0 and plain > 0 and accept_len >= 1):
        raise ConfigError(f"--engine-costs: {path} has speedup {speedup}, plain tokens/s {plain}, accept_len "
                          f"{accept_len}; a measured report has positive ones")
    return ServedStep(k, accept_len / speedup, 1000.0 / plain,
                      (r.get("engine"), r.get("engine_version"), r.get("dtype")),
                      (r.get("checkpoint"), r.get("verifier"), temperature), path, speedup, accept_len, draft_ms)


def fit_step(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per_token) of step(k) = fixed + per_token * k, in plain steps, least squares through two or more
    (k, step) points. fixed: the verify forward and the per-step work of speculation (input preparation, rejection
    sampling, scheduling); per_token: one draft forward and what one more token adds to the verify forward."""
    assert len({k for k, _ in points}) >= 2, points
    n = len(points)
    mean_k = sum(k for k, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    per_token = (sum((k - mean_k) * (s - mean_s) for k, s in points)
                 / sum((k - mean_k) ** 2 for k, _ in points))
    return mean_s - per_token * mean_k, per_token


def engine_costs(paths: Sequence[Path], max_k: int, clock: str = "wall", draft_ms: float | None = None
                 ) -> StepCosts:
    """Step costs from eagle3.serve reports: each report's plain server gives the plain step, and its measured
    speedup (`clock` cpu: in the servers' CPU time) and accept_len give its step, accept_len / speedup plain
    steps. Reports at two or more k (one engine and dtype): `fit_step` fits step(k) = fixed + per_token * k to
    them. One report, at k=1: per_token is the draft forward's own cost, `draft_ms` (measured by the harness, or
    given) or else the one eagle3.serve timed between the report's requests, and fixed what is left of step(1): an
    engine's per-step work is paid once per step, whatever k, and each further draft token adds a draft forward."""
    steps = [served_step(path, clock) for path in paths]
    if len(steps) == 1 and steps[0].k != 1:
        raise ConfigError(f"--engine-costs: {paths[0]} was served at k={steps[0].k}; the verify step is calibrated "
                          "at k=1 (eagle3 serve RUN --k 1), or give reports at two or more k")
    timed_by = "given" if draft_ms is not None else "timed by eagle3 serve between the requests"
    if len(steps) == 1 and draft_ms is None:
        draft_ms = steps[0].draft_ms
    if len(steps) == 1 and draft_ms is None:
        raise ConfigError(f"--engine-costs: one report ({paths[0]}, k=1) fixes step(1) alone, not how it grows with "
                          "k, and it holds no draft_forward_ms (eagle3 serve times the draft since it writes one): "
                          "give the draft forward's cost (--measure: measured here with the run's draft, or "
                          "--draft-ms), or reports at two or more k")
    if draft_ms is not None and not (math.isfinite(draft_ms) and draft_ms > 0):
        raise ConfigError(f"--draft-ms: the draft forward's cost must be a positive, finite number of ms, got "
                          f"{draft_ms}")
    if len(steps) > 1 and draft_ms is not None:
        raise ConfigError("--engine-costs: reports at several k give the per-token cost by their fit; --measure or "
                          "--draft-ms goes with one report, at k=1")
    ks = [s.k for s in steps]
    if len(set(ks)) != len(ks):
        raise ConfigError(f"--engine-costs: the reports are at k = {ks}; a fit needs each k once")
    if len({s.setup for s in steps}) > 1:
        raise ConfigError("--engine-costs: the reports come from different engines or dtypes ("
                          + "; ".join(f"{s.path}: {' '.join(map(str, s.setup))}" for s in steps) + "); fit one's")
    if len({s.run for s in steps}) > 1:
        raise ConfigError("--engine-costs: the reports come from different served runs ("
                          + "; ".join(f"{s.path}: checkpoint {s.run[0]}, verifier {s.run[1]}, temperature {s.run[2]}"
                                      for s in steps) + "); fit the reports of one checkpoint, verifier and "
                          "temperature (eagle3 serve RUN --k 1 5)")
    baseline_ms = sum(s.plain_ms for s in steps) / len(steps)
    if draft_ms is None:
        fixed, per_token = fit_step([(s.k, s.plain_steps) for s in steps])
        form = f"{fixed:.3f} + {per_token:.3f} k"
    else:
        per_token = draft_ms / baseline_ms
        fixed = steps[0].plain_steps - per_token
        form = f"{fixed:.3f} + {per_token:.3f} k (per token: the draft forward, {draft_ms:.3f} ms, {timed_by})"
    if fixed <= 0 or per_token < 0:
        raise ConfigError("--engine-costs: step(k) = {:.3f} + {:.3f} k plain steps (from k = {}: {}) has a cost "
                          "below zero: the reports' timings are noise; serve more prompts or tokens".format(
                              fixed, per_token, ks, ", ".join(f"{s.plain_steps:.3f}" for s in steps)))
    engine, version, dtype = steps[0].setup
    return StepCosts(baseline_ms, dict.fromkeys(range(1, max_k + 1), fixed * baseline_ms), per_token * baseline_ms,
                     f"engine: {engine} {version} {dtype}, plain server and k = {', '.join(map(str, ks))} of "
                     f"{', '.join(str(s.path) for s in steps)}, {clock} time; step(k) = {form} plain steps",
                     fitted_ks=tuple(ks))


def served_speedups(first: ServedStep, ks: Sequence[int], clock: str = "wall") -> dict[int, tuple[float, float]]:
    """k -> (measured speedup (`clock` cpu: in the servers' CPU time), accept_len) of the eagle3.serve reports
    beside the `first` one fitted (same dir, temperature) at `ks`."""
    found = {}
    for k in ks:
        report = first.path.parent / f"serve_vllm_k{k}_t{first.run[2]:g}.json"
        if report.is_file():
            step = served_step(report, clock)
            found[k] = (step.speedup, step.accept_len)
    return found


def against_engine(rates: list[float], source: str, reports: Sequence[Path], clock: str,
                   draft_ms: float | None = None) -> tuple[dict[str, Any], str]:
    """The prediction from the engine's step costs, with the serve reports beside the first (same dir and
    temperature) as measured: at each k served, the speedup the costs predict at the accept_len it served with
    (which checks the costs alone; rates of one k hold only roughly at another) and its error."""
    costs = engine_costs(reports, len(rates), clock, draft_ms)
    prediction = predict(rates, costs)
    measured = served_speedups(served_step(reports[0], clock), range(1, len(rates) + 1), clock)
    for row in prediction["rows"]:
        if row["k"] in measured:
            speedup, accept_len = measured[row["k"]]
            at_served = accept_len / row["step_ms"] * prediction["baseline_ms"]
            row |= {"served_speedup": speedup, "predicted_at_served_accept_len": at_served,
                    "error": at_served / speedup - 1, "in_fit": row["k"] in costs.fitted_ks}
    return ({**prediction, "accept_source": source, "fitted_ks": list(costs.fitted_ks),
             "fixed_plain_steps": costs.verify_ms[1] / costs.baseline_ms,
             "per_token_plain_steps": costs.draft_ms / costs.baseline_ms}, format_prediction(prediction, source))
