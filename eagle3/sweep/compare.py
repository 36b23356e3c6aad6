"""Compare runs from their run dirs alone: a table ranked by best val tau_sim, and a plot.

    eagle3 compare outputs/multirun/2026-11-29/10-00-00            # a sweep dir
    eagle3 compare outputs/2026-11-29/10-00-00 outputs/...         # run dirs, or both
    eagle3 compare SWEEP --format csv --plot sweep.png
    eagle3 compare SWEEP --confirm 3       # + measured acceptance of the 3 best by tau_sim

Columns: every config key whose value differs between the runs, then step-0, best and final val
metrics. Runs are ranked by tau_sim (simulated acceptance length), not loss: acceptance can peak while
loss still falls. A run that failed or never evaluated is listed as such, at the bottom. With the step costs
of a deployment (--baseline-ms, --verify-ms, --draft-ms), a predicted-speedup column is added and the runs
are ranked by it: what serving would gain (eagle3.eval.speedup's model). Runs served by vLLM (eagle3.serve's
serve_vllm_k*.json) show the speedup and accept_len the engine measured (`served`), ahead of those columns;
`--rank-by served` ranks by that speedup. A served speedup that is not a result (above what its accept_len allows,
or measured while the machine's speed moved: eagle3.serve's `implausible`) is shown as "not a result" and ranked
with the runs that were not served. `--forecast` adds the acceptance forecast of each run (eagle3.sweep.forecast:
accept_len at 10x its tokens with its band, the fitted asymptote, the tokens to pass n-gram).

tau_sim is an estimate that orders drafts cheaply; `--confirm N` measures acceptance (eagle3.eval.accept) of
the N best runs by tau_sim (those without an `accept_k*.json` yet: a rerun measures nothing twice), and prints
the runs that have one ranked both ways, side by side. A sweep dir holding an Optuna study (`study.db`) adds its
history to the plot.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from typing import Any

from eagle3.errors import ConfigError
from eagle3.sweep.runs import Run, find_runs, read_run  # noqa: F401  (find_runs, read_run: the runs compared)

# Keys that differ between any two runs without saying anything about them.
IGNORED_PREFIXES = ("run.", "resume")

def differing_keys(runs: list[Run]) -> list[str]:
    """Keys with more than one value among the runs that have them (a run that failed early has only its overrides)."""
    keys = sorted({k for r in runs for k in r.config if not k.startswith(IGNORED_PREFIXES)})
    return [k for k in keys if len({json.dumps(r.config[k], default=str) for r in runs if k in r.config}) > 1]


def rank(runs: list[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.best_tau is None, -(r.best_tau or 0.0)))


def steps_to_reach(run: Run, target: float) -> int | None:
    """The first val step at which `run` reached `target` tau_sim, if it did."""
    return next((r["step"] for r in run.val_rows if r["tau_sim"] >= target), None)


def table(runs: list[Run], baseline: str | None = None, costs: dict[str, float] | None = None,
          by: str = "tau_sim", forecast: bool = False) -> tuple[list[str], list[list[str]]]:
    keys = differing_keys(runs)
    header = ["run", "status", *keys, "tau_sim@0", "best tau_sim", "best step", "final tau_sim", "loss@0",
              "final loss"]
    target = None
    if baseline is not None:
        base = next((r for r in runs if r.label == baseline), None)
        if base is None or base.best_tau is None:
            raise SystemExit(f"error: --baseline {baseline}: no completed run with that label "
                             f"(labels: {', '.join(r.label for r in runs)})")
        target = base.best_tau
        header.append(f"steps to {baseline}'s best")
    served = {id(r): served_report(r) for r in runs}
    if any(served.values()):
        header += ["served speedup", "served accept_len", "served k"]
    # the n-gram baseline eagle3.serve measured in the same turns, and plain: side by side with the drafter
    with_ngram = any(r and "ngram" in r for r in served.values())
    if with_ngram:
        header += ["served tok/s", "n-gram accept_len", "n-gram tok/s", "n-gram speedup", "plain tok/s"]
    predicted = {id(r): predicted_speedup(r, costs) for r in runs} if costs else {}
    if costs:
        header += ["pred. speedup", "at k", "rates"]
    if forecast:
        header += FORECAST_COLUMNS
    body = []
    for run in ranked(runs, by, served, predicted):
        cells = [run.label, run.status, *(_fmt(run.config.get(k)) for k in keys)]
        if run.summary:
            s = run.summary
            cells += [_fmt(s.step0["tau_sim"]), _fmt(s.best["tau_sim"]), str(s.best["step"]),
                      _fmt(s.final["tau_sim"]), _fmt(s.step0["loss"]), _fmt(s.final["loss"])]
        else:  # failed or incomplete: what its metrics.jsonl holds (no final values: it did not finish)
            cells += val_row_cells(run.val_rows)
        if target is not None:
            cells.append(_fmt(steps_to_reach(run, target)) if run.val_rows else "-")
        if any(served.values()):
            r = served[id(run)]
            speedup = "-" if not r else "not a result" if r.get("not_a_result") else f"{r['speedup']:.3f}"
            cells += [speedup, _fmt(r["accept_len"]), str(r["k"])] if r else ["-"] * 3
        if with_ngram:
            r, n = served[id(run)], (served[id(run)] or {}).get("ngram")
            cells += [f"{r['tokens_per_s']:.1f}" if r else "-", _fmt(n["accept_len"]) if n else "-",
                      f"{n['tokens_per_s']:.1f}" if n else "-",
                      "-" if not n else "not a result" if n.get("implausible") else f"{n['speedup']:.3f}",
                      f"{r['plain_tokens_per_s']:.1f}" if r else "-"]
        if costs:
            p = predicted[id(run)]
            cells += [f"{p['speedup']:.3f}", str(p["k"]), p["source"]] if p else ["-"] * 3
        if forecast:
            cells += forecast_cells(run)
        body.append(cells)
    return header, body


def val_row_cells(val_rows: list[dict[str, Any]]) -> list[str]:
    """tau_sim@0, best tau_sim, best step, final tau_sim, loss@0, final loss of a run without summary.json."""
    step0 = next((r for r in val_rows if r["step"] == 0), {})
    best = max(val_rows, key=lambda r: r["tau_sim"], default={})
    return [_fmt(step0.get("tau_sim")), _fmt(best.get("tau_sim")), _fmt(best.get("step")), "-",
            _fmt(step0.get("loss")), "-"]


# --- the acceptance forecast (eagle3.sweep.forecast), --forecast ------------------------------------------------

FORECAST_COLUMNS = ["fc. accept_len@10x", "fc. 90% band", "fc. asymptote", "fc. tokens to n-gram"]


def forecast_cells(run: Run) -> list[str]:
    """The forecast's accept_len at 10x the run's tokens, its band, the fitted asymptote, and the tokens to pass
    the n-gram baseline eagle3.serve measured beside it; "-" where the run cannot be forecast (too short, flat)."""
    from eagle3.errors import ForecastError
    from eagle3.sweep.forecast import Options, forecast_run, tokens_text

    try:
        report = forecast_run(run, Options(bootstrap=200))
    except ForecastError:
        return ["-"] * len(FORECAST_COLUMNS)
    at10 = next(a for a in report["at"] if abs(a["tokens"] - 10 * report["tokens_so_far"]) < 1e-6 * a["tokens"])
    ngram = next((g for g in report["reach"] if g["name"] == "n-gram"), None)
    to_ngram = "-" if ngram is None else tokens_text(ngram["tokens"]) if ngram["within"] else "not within " + \
        tokens_text(report["horizon_tokens"])
    return [f"{at10['accept_len']:.3f}", f"[{at10['low']:.3f}, {at10['high']:.3f}]",
            f"{report['curve']['asymptote_accept_len']:.3f}", to_ngram]


# --- predicted serving speedup (eagle3.eval.speedup) for given step costs ---------------------------------------

def predicted_speedup(run: Run, costs: dict[str, float]) -> dict[str, Any] | None:
    """The best predicted speedup over k of `run` at `costs` (baseline_ms, verify_ms, draft_ms): from the measured
    accept rates of its greedy accept_k*.json report with the largest k if it has one ("measured"), else from its
    best val row's full_acc_* ("estimate": teacher-forced, usually above what serving accepts)."""
    from eagle3.eval.speedup import StepCosts, predict

    rates, source = None, "estimate"
    reports = sorted(run.path.glob("accept_k*.json"), key=lambda f: f.stem)
    greedy = [json.loads(f.read_text()) for f in reports if "_t" not in f.stem]
    if greedy:
        rates, source = max(greedy, key=lambda r: r["k"])["accept_rate"], "measured"
    elif run.summary:
        best = run.summary.best
        rates = [best[f"full_acc_{j}"] for j in range(len(best)) if f"full_acc_{j}" in best]
    if not rates:
        return None
    ks = range(1, len(rates) + 1)
    prediction = predict(rates, StepCosts(costs["baseline_ms"], {k: costs["verify_ms"] for k in ks}, costs["draft_ms"]))
    best = prediction["rows"][prediction["best_k"] - 1]
    return {"speedup": best["speedup"], "k": best["k"], "source": source}


def ranked(runs: list[Run], by: str, served: dict[int, dict[str, Any] | None],
           predicted: dict[int, dict[str, Any] | None]) -> list[Run]:
    """By the speedup vLLM measured (`by` served), else by the predicted one when step costs are given, else by
    tau_sim; runs without the value below, in tau_sim order."""
    values = {key: rankable(r) for key, r in served.items()} if by == "served" else predicted if predicted else None
    if values is None:
        return rank(runs)
    return sorted(rank(runs), key=lambda r: (values[id(r)] is None, -(values[id(r)] or {"speedup": 0.0})["speedup"]))


# --- served by vLLM (eagle3.serve) -------------------------------------------------------------------------------

def served_report(run: Run) -> dict[str, Any] | None:
    """The run's greedy fp32 eagle3.serve report with the highest measured speedup (serve_vllm_k<k>_t0.json), or
    of any other temperature or dtype when it has no such report; of the reports that are a result (see
    `not_a_result`). A run whose every report is not one gets its best such report with "not_a_result": the
    reasons, which the table shows and no ranking takes."""
    reports = [json.loads(f.read_text()) | {"path": str(f)} for f in sorted(run.path.glob("serve_vllm_k*_t*.json"))]
    preferred = [r for r in reports if r.get("temperature") == 0 and r.get("dtype") == "float32"] or reports
    results = [r for r in preferred if not not_a_result(r)]
    if results or not preferred:
        return max(results, key=lambda r: r["speedup"], default=None)
    flagged = max(preferred, key=lambda r: r["speedup"])
    return flagged | {"not_a_result": not_a_result(flagged)}


def not_a_result(report: dict[str, Any]) -> list[str]:
    """Why a serve report's speedup is no result: the reasons eagle3.serve recorded (`implausible`), and, for a
    report written before it recorded them, a speedup above what its accept_len allows."""
    from eagle3.serve.metrics import implausible

    recorded = list(report.get("implausible") or [])
    return recorded or implausible({"speedup": report["speedup"]}, report.get("accept_len"), [])


def rankable(served: dict[str, Any] | None) -> dict[str, Any] | None:
    """A served report the ranking may take: None for one that is not a result."""
    return None if served is None or served.get("not_a_result") else served


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-3 or abs(value) >= 1e4 else f"{value:.4f}".rstrip("0").rstrip(".")
    return "-" if value is None else str(value)


def render(header: list[str], body: list[list[str]], fmt: str) -> str:
    if fmt == "csv":
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([header, *body])
        return out.getvalue()
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    if fmt == "markdown":
        lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |" for row in [header, *body]]
        lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
        return "\n".join(lines) + "\n"
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in [header, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


# --- measured acceptance beside tau_sim (--confirm) -------------------------------------------------------------


def accept_report(run: Run) -> dict[str, Any] | None:
    """The run's `accept_k<k>.json` (eagle3.eval.accept --run), k = its ttt_steps if there are several."""
    # Greedy reports only: tau_sim is a greedy estimate, and at T > 0 eagle3.eval.accept writes accept_k<k>_t<T>.json.
    reports = sorted(f for f in run.path.glob("accept_k*.json") if "_t" not in f.stem)
    if not reports:
        return None
    preferred = run.path / f"accept_k{run.config.get('model.draft.ttt_steps')}.json"
    return json.loads((preferred if preferred in reports else reports[0]).read_text())


def confirm(runs: list[Run], n: int) -> list[str]:
    """Measures acceptance of the n best completed runs by tau_sim that have no report yet; returns the
    runs whose measurement failed (each said on stderr), the others' reports are in their run dirs."""
    if n < 0:
        raise ConfigError(f"--confirm must be >= 0, got {n}")
    from eagle3.errors import UserError
    from eagle3.eval import accept
    from eagle3.eval.measure import LosslessError

    failed = []
    completed = [r for r in rank(runs) if r.status == "completed"]
    chosen = [r for r in completed[:n] if accept_report(r) is None]
    # Why the runs that are not measured are not: said once, so that "--confirm 5" measuring one run is explained.
    reasons = {"have a measurement already (accept_k*.json)": [r for r in completed[:n] if accept_report(r)],
               f"are below the {n} best by tau_sim": completed[n:],
               "did not complete": [r for r in runs if r.status != "completed"]}
    for why, skipped in reasons.items():
        if skipped:
            labels = [f"{r.label} ({r.status})" if r.status != "completed" else r.label for r in skipped]
            print(f"--confirm {n}: not measuring {', '.join(labels)}: they {why}", file=sys.stderr)
    if len(completed) < n:
        print(f"--confirm {n}: only {len(completed)} of the {len(runs)} runs completed", file=sys.stderr)
    for run in chosen:
        print(f"measuring acceptance of {run.label} ({run.path.name}) ...", file=sys.stderr, flush=True)
        try:
            report = accept.run(accept.AcceptRequest(run=str(run.path)))
        except (UserError, LosslessError) as e:
            print(f"error: {run.label}: {e}", file=sys.stderr)
            failed.append(run.label)
            continue
        print(f"{run.label}: accept_len {report['accept_len']:.4f} ({report['report_path']}, "
              f"{report['wall_s']:.1f} s)", file=sys.stderr)
    return failed


def rankings(runs: list[Run]) -> tuple[list[str], list[list[str]]]:
    """The runs with measured acceptance, ranked by best val tau_sim and by accept_len, side by side."""
    measured: list[tuple[Run, float, dict[str, Any]]] = []  # (run, its best tau_sim, its accept report)
    for run in runs:
        report = accept_report(run)
        if run.best_tau is not None and report is not None:
            measured.append((run, run.best_tau, report))
    by_tau = sorted(measured, key=lambda m: -m[1])
    by_accept = sorted(by_tau, key=lambda m: -m[2]["accept_len"])  # ties keep their tau_sim order
    header = ["rank", "by tau_sim", "best tau_sim", "its accept_len", "by accept_len", "accept_len",
              "its best tau_sim"]
    body = [[str(i + 1), t.label, _fmt(t_tau), _fmt(t_report["accept_len"]), a.label, _fmt(a_report["accept_len"]),
             _fmt(a_tau)] for i, ((t, t_tau, t_report), (a, a_tau, a_report)) in enumerate(zip(by_tau, by_accept))]
    return header, body


def rankings_text(runs: list[Run], fmt: str) -> str:
    header, body = rankings(runs)
    if not body:
        return "" if fmt == "csv" else "\nno run has measured acceptance (accept_k*.json) yet\n"
    if fmt == "csv":
        return "\n" + render(header, body, fmt)
    reports = [accept_report(r) for r in runs if r.best_tau is not None]
    settings = {(r["k"], r["prompts"], r["max_new_tokens"]) for r in reports if r is not None}
    what = "; ".join(f"k={k}, {p} prompts x {t} tokens" for k, p, t in sorted(settings))
    return (f"\nmeasured acceptance ({what}) against tau_sim, {len(body)} runs ranked both ways:\n"
            + render(header, body, fmt))


if __name__ == "__main__":  # the older path of `eagle3 compare` (eagle3/cli/compare.py)
    import runpy

    sys.argv[0:1] = ["eagle3", "compare"]
    runpy.run_module("eagle3.cli", run_name="__main__")
