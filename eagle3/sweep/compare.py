"""Compare runs from their run dirs alone: a table ranked by best val tau_sim, and a plot.

    python -m eagle3.sweep.compare outputs/multirun/2026-11-29/10-00-00            # a sweep dir
    python -m eagle3.sweep.compare outputs/2026-11-29/10-00-00 outputs/...         # run dirs, or both
    python -m eagle3.sweep.compare SWEEP --format csv --plot sweep.png
    python -m eagle3.sweep.compare SWEEP --confirm 3       # + measured acceptance of the 3 best by tau_sim

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

import argparse
import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from eagle3.errors import ConfigError
from eagle3.rundir.files import FAILURE, RESOLVED_CONFIG, SUMMARY, RunDir, data_part_before_sources, flatten
from eagle3.sweep.study import STUDY_FILE  # hydra_plugins/eagle3_optuna_sweeper keeps the study there, in the sweep dir

# Keys that differ between any two runs without saying anything about them.
IGNORED_PREFIXES = ("run.", "resume")

if TYPE_CHECKING:
    from eagle3.rundir.progress import RunSummary


@dataclass
class Run:
    path: Path
    status: str                                   # completed | failed | incomplete | unreadable
    config: dict[str, Any] = field(default_factory=dict)  # flattened: {"optim.lr": 1e-05, ...}
    summary: RunSummary | None = None
    val_rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        head = self.path.name.split("_", 1)[0]
        return f"#{head}" if head.isdigit() else self.path.name

    @property
    def best_tau(self) -> float | None:
        return self.summary.best["tau_sim"] if self.summary else None


def find_runs(paths: list[Path]) -> list[Run]:
    """Run dirs under each path (a run dir itself, or a sweep dir holding run dirs), failed ones included."""
    dirs: list[Path] = []
    for path in paths:
        if not path.is_dir():
            raise SystemExit(f"error: {path} is not a directory")
        if _is_run_dir(path):
            dirs.append(path)
            continue
        found = sorted((d for d in path.iterdir() if d.is_dir() and _is_run_dir(d)), key=_job_order)
        if not found:
            raise SystemExit(f"error: {path} holds no run dirs (no resolved_config.yaml or failure.json in it "
                             "or its sub-dirs)")
        dirs.extend(found)
    return [read_run(d) for d in dirs]


def _is_run_dir(path: Path) -> bool:
    return RunDir(path).is_run()


def _job_order(path: Path) -> tuple[int, str]:
    head = path.name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, path.name)


def read_run(path: Path) -> Run:
    """A run dir's files. One that cannot be read whole (cut by a kill or a full disk) makes the run "unreadable",
    named in run.error, and the other runs are shown as usual; a metrics.jsonl line that is not a whole row is
    left out with a warning (a kill can cut the last one; a resume drops it too)."""
    room = RunDir(path)
    config_file, summary_file, failure_file = (room.file(n) for n in (RESOLVED_CONFIG, SUMMARY, FAILURE))
    bad: list[str] = []
    config = _read(config_file, yaml.safe_load, bad) if config_file.is_file() else None
    config = flatten(data_part_before_sources(config)) if isinstance(config, dict) else {}
    if not config and (path / ".hydra" / "overrides.yaml").is_file():  # failed before its config was written
        overrides = yaml.safe_load((path / ".hydra" / "overrides.yaml").read_text()) or []
        config = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in overrides if "=" in o)}
    rows = metrics_rows(path / "metrics.jsonl") if (path / "metrics.jsonl").is_file() else []
    run = Run(path, "incomplete", config, val_rows=[r for r in rows if r.get("split") == "val"])
    try:
        if failure_file.is_file():
            run.status, run.error = "failed", room.read_failure().error
        elif summary_file.is_file():
            summary = room.read_summary()
            if not _is_summary(summary):
                raise ConfigError(f"{summary_file}: not a run summary (no step0, best and final val rows)")
            run.status, run.summary = "completed", summary
    except ConfigError as e:
        bad.append(str(e))
    if bad:
        run.status, run.error = "unreadable", "; ".join(bad)
    return run


def _is_summary(summary: RunSummary) -> bool:
    """Whether a summary has the val rows the table shows."""
    return all({"tau_sim", "loss", "step"} <= row.keys() for row in (summary.step0, summary.best, summary.final))


def _read(file: Path, parse: Any, bad: list[str]) -> Any:
    """`parse` of the file's text; None, with the reason added to `bad`, when it is not whole."""
    try:
        return parse(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as e:  # ValueError: JSON, and UnicodeDecodeError
        bad.append(f"{file}: cannot be read ({str(e).splitlines()[0]}; cut short by a kill or a full disk?)")
        return None


def metrics_rows(file: Path) -> list[dict[str, Any]]:
    """The whole rows of a metrics.jsonl; a line that is not one is left out and named on stderr."""
    rows = []
    for n, line in enumerate(file.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if not isinstance(row, dict) or "step" not in row or (row.get("split") == "val" and "tau_sim" not in row):
            print(f"warning: {file} line {n} is not a whole metrics row (cut short by a kill or a full disk?): "
                  f"left out", file=sys.stderr)
            continue
        rows.append(row)
    return rows


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


def plot(runs: list[Run], out: Path, history: StudyHistory | None = None) -> None:
    """Val tau_sim and val loss against step for every run; per-position accuracy of the best run; the
    study's objective by trial, if the sweep was an Optuna study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = differing_keys(runs)
    evaluated = [r for r in rank(runs) if r.val_rows]
    if not evaluated:
        raise SystemExit("error: no run has val rows to plot")
    fig, axes = plt.subplots(1, 3 + (history is not None), figsize=(17 + 5.5 * (history is not None), 5))
    for run in evaluated:
        name = ", ".join(f"{k.split('.')[-1]}={_fmt(run.config.get(k))}" for k in keys) or run.label
        steps = [r["step"] for r in run.val_rows]
        axes[0].plot(steps, [r["tau_sim"] for r in run.val_rows], marker="o", label=name)
        axes[1].plot(steps, [r["loss"] for r in run.val_rows], marker="o", label=name)
    best = evaluated[0]
    positions = sorted(int(k.rsplit("_", 1)[1]) for k in best.val_rows[0] if k.startswith("full_acc_"))
    for k in positions:
        steps = [r["step"] for r in best.val_rows]
        axes[2].plot(steps, [r[f"full_acc_{k}"] for r in best.val_rows], marker="o", label=f"full_acc_{k}")
        axes[2].plot(steps, [r[f"cond_acc_{k}"] for r in best.val_rows], linestyle="--", label=f"cond_acc_{k}")
    titles = ["val tau_sim (simulated acceptance length)", "val loss",
              f"per-position val accuracy, best run {best.label}"]
    ylabels = ["tau_sim", "loss", "accuracy"]
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if history is not None:
        plot_history(axes[3], history)
    fig.tight_layout()
    from eagle3.safe_write import replace_file

    # whole, and never through a link at `out`
    replace_file(out.parent, out, lambda tmp: fig.savefig(tmp, dpi=110, format=out.suffix.lower()[1:]))
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3.sweep.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs or sweep dirs")
    parser.add_argument("--format", choices=["plain", "markdown", "csv"], default="plain")
    parser.add_argument("--plot", type=Path, help="write a PNG of the val curves here")
    parser.add_argument("--baseline", help="a run's label (first column, e.g. '#0'): adds the step at which each "
                                           "run first reached that run's best tau_sim")
    parser.add_argument("--baseline-ms", type=float, help="with --verify-ms: adds the serving speedup each run's "
                                                           "accept rates predict (eagle3.eval.speedup) and ranks by "
                                                           "it; the verifier's plain decoding, ms per token")
    parser.add_argument("--verify-ms", type=float, help="the verifier's forward over a verify step's k+1 tokens, ms")
    parser.add_argument("--draft-ms", type=float, default=0.0, help="one draft forward, ms (default 0)")
    parser.add_argument("--rank-by", choices=["tau_sim", "served"], default="tau_sim",
                        help="served: by the speedup vLLM measured (eagle3.serve's reports in the run dirs); "
                             "default: by the predicted speedup when step costs are given, else by tau_sim")
    parser.add_argument("--confirm", type=int, metavar="N", help="measure acceptance (eagle3.eval.accept --run) of "
                        "the N best runs by tau_sim (those without an accept_k*.json yet), then rank the measured runs "
                        "by tau_sim and by accept_len side by side (0: only the rankings)")
    parser.add_argument("--forecast", action="store_true", help="adds the acceptance forecast's columns "
                        "(python -m eagle3.cli.forecast): accept_len at 10x each run's tokens, its 90%% band, the "
                        "fitted asymptote, the tokens to pass n-gram")
    args = parser.parse_args(argv)
    costs = None
    if args.baseline_ms is not None or args.verify_ms is not None:
        if args.baseline_ms is None or args.verify_ms is None or min(args.baseline_ms, args.verify_ms) <= 0 \
                or args.draft_ms < 0:
            raise SystemExit("error: the predicted speedup needs --baseline-ms and --verify-ms (> 0), "
                             "and --draft-ms >= 0")
        costs = {"baseline_ms": args.baseline_ms, "verify_ms": args.verify_ms, "draft_ms": args.draft_ms}
    if args.plot and args.plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise SystemExit(f"error: --plot {args.plot}: give a .png, .pdf or .svg file name")
    if args.plot and args.plot.is_symlink():  # before measuring anything; the plot is never written through one
        from eagle3.safe_write import link_message

        raise SystemExit(f"error: --plot: {link_message(args.plot.parent, args.plot, 'the plot')}")
    runs = find_runs(args.paths)
    failed_measurements = confirm(runs, args.confirm) if args.confirm is not None else []
    sys.stdout.write(render(*table(runs, args.baseline, costs, args.rank_by, args.forecast), args.format))
    if args.confirm is not None:
        sys.stdout.write(rankings_text(runs, args.format))
    if args.plot:
        plot(runs, args.plot, study_history(args.paths))
        print(f"plot: {args.plot}", file=sys.stderr)
    for run in runs:  # the table says "not a result"; here is why
        flagged = served_report(run)
        if flagged and flagged.get("not_a_result"):
            print(f"warning: run {run.label}: {flagged['path']} is not a result, not ranked: "
                  f"{'; '.join(flagged['not_a_result'])}", file=sys.stderr)
    unreadable = [r for r in runs if r.status == "unreadable"]
    for run in unreadable:  # shown in the table with what its metrics hold; its numbers may be incomplete
        print(f"error: run {run.label}: {run.error}", file=sys.stderr)
    return 1 if failed_measurements or unreadable else 0


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
        raise SystemExit(f"error: --confirm must be >= 0, got {n}")
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
            report = accept.run(accept.parse_args(["--run", str(run.path)]))
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


# --- an Optuna study's history (sweeps made with hydra/sweeper=optuna) ------------------------------------------


@dataclass
class StudyHistory:
    objective: str
    direction: str
    trials: list[tuple[int, str, float | None]]   # (number, state, value) in trial order


def study_history(paths: list[Path]) -> StudyHistory | None:
    """The trials of the Optuna study in the one sweep dir given, if it holds one (optuna imported only then)."""
    files = [p / STUDY_FILE for p in paths if (p / STUDY_FILE).is_file()]
    if len(files) != 1 or len(paths) != 1:
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{files[0].resolve()}"
    names = optuna.get_all_study_names(storage)
    if len(names) != 1:
        return None
    study = optuna.load_study(study_name=names[0], storage=storage)
    trials = [(t.number, t.state.name, t.value) for t in study.get_trials(deepcopy=False)]
    return StudyHistory(study.user_attrs.get("objective") or "objective", study.direction.name.lower(), trials)


def best_so_far(history: StudyHistory) -> list[tuple[int, float]]:
    """(trial number, best value among the completed trials up to it) at each completed trial."""
    better = max if history.direction == "maximize" else min
    out: list[tuple[int, float]] = []
    for number, state, value in history.trials:
        if state == "COMPLETE" and value is not None:
            out.append((number, value if not out else better(out[-1][1], value)))
    return out


def plot_history(ax, history: StudyHistory) -> None:
    done = [(n, v) for n, s, v in history.trials if s == "COMPLETE" and v is not None]
    failed = [n for n, s, _ in history.trials if s == "FAIL"]
    if done:
        ax.plot(*zip(*done), "o", label=f"trial {history.objective}")
        ax.step(*zip(*best_so_far(history)), where="post", label="best so far")
    if failed:
        low = min((v for _, v in done), default=0.0)
        ax.plot(failed, [low] * len(failed), "x", color="red", label="failed")
    ax.set_title(f"Optuna study: {history.objective} by trial ({history.direction})")
    ax.set_xlabel("trial")
    ax.set_ylabel(history.objective)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


if __name__ == "__main__":
    raise SystemExit(main())
