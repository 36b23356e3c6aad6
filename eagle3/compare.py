"""Compare runs from their run dirs alone: a table ranked by best val tau_sim, and a plot.

    python -m eagle3.compare outputs/multirun/2026-11-29/10-00-00            # a sweep dir
    python -m eagle3.compare outputs/2026-11-29/10-00-00 outputs/...         # run dirs, or both
    python -m eagle3.compare SWEEP --format csv --plot sweep.png

Columns: every config key whose value differs between the runs, then step-0, best and final val
metrics. Runs are ranked by tau_sim (simulated acceptance length), not loss: acceptance can peak while
loss still falls. A run that failed or never evaluated is listed as such, at the bottom.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

# Keys that differ between any two runs without saying anything about them.
IGNORED_PREFIXES = ("run.", "resume")


@dataclass
class Run:
    path: Path
    status: str                                   # completed | failed | incomplete
    config: dict[str, Any] = field(default_factory=dict)  # flattened: {"optim.lr": 1e-05, ...}
    summary: dict[str, Any] | None = None
    val_rows: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None

    @property
    def label(self) -> str:
        head = self.path.name.split("_", 1)[0]
        return f"#{head}" if head.isdigit() else self.path.name

    @property
    def best_tau(self) -> float | None:
        return self.summary["best"]["tau_sim"] if self.summary else None


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
    return (path / "resolved_config.yaml").is_file() or (path / "failure.json").is_file()


def _job_order(path: Path) -> tuple[int, str]:
    head = path.name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, path.name)


def read_run(path: Path) -> Run:
    config_file, summary_file, failure_file = (path / n for n in ("resolved_config.yaml", "summary.json",
                                                                   "failure.json"))
    config = flatten(yaml.safe_load(config_file.read_text())) if config_file.is_file() else {}
    if not config and (path / ".hydra" / "overrides.yaml").is_file():  # failed before its config was written
        overrides = yaml.safe_load((path / ".hydra" / "overrides.yaml").read_text()) or []
        config = {k: yaml.safe_load(v) for k, v in (o.split("=", 1) for o in overrides if "=" in o)}
    rows = []
    if (path / "metrics.jsonl").is_file():
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    run = Run(path, "incomplete", config, val_rows=[r for r in rows if r["split"] == "val"])
    if failure_file.is_file():
        run.status, run.error = "failed", json.loads(failure_file.read_text())["error"]
    elif summary_file.is_file():
        run.status, run.summary = "completed", json.loads(summary_file.read_text())
    return run


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def differing_keys(runs: list[Run]) -> list[str]:
    """Keys with more than one value among the runs that have them (a run that failed early has only its overrides)."""
    keys = sorted({k for r in runs for k in r.config if not k.startswith(IGNORED_PREFIXES)})
    return [k for k in keys if len({json.dumps(r.config[k], default=str) for r in runs if k in r.config}) > 1]


def rank(runs: list[Run]) -> list[Run]:
    return sorted(runs, key=lambda r: (r.best_tau is None, -(r.best_tau or 0.0)))


def steps_to_reach(run: Run, target: float) -> int | None:
    """The first val step at which `run` reached `target` tau_sim, if it did."""
    return next((r["step"] for r in run.val_rows if r["tau_sim"] >= target), None)


def table(runs: list[Run], baseline: str | None = None) -> tuple[list[str], list[list[str]]]:
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
    body = []
    for run in rank(runs):
        cells = [run.label, run.status, *(_fmt(run.config.get(k)) for k in keys)]
        if run.summary:
            s = run.summary
            cells += [_fmt(s["step0"]["tau_sim"]), _fmt(s["best"]["tau_sim"]), str(s["best"]["step"]),
                      _fmt(s["final"]["tau_sim"]), _fmt(s["step0"]["loss"]), _fmt(s["final"]["loss"])]
        else:  # failed or incomplete: what its metrics.jsonl holds (no final values: it did not finish)
            cells += val_row_cells(run.val_rows)
        if target is not None:
            cells.append(_fmt(steps_to_reach(run, target)) if run.val_rows else "-")
        body.append(cells)
    return header, body


def val_row_cells(val_rows: list[dict[str, Any]]) -> list[str]:
    """tau_sim@0, best tau_sim, best step, final tau_sim, loss@0, final loss of a run without summary.json."""
    step0 = next((r for r in val_rows if r["step"] == 0), {})
    best = max(val_rows, key=lambda r: r["tau_sim"], default={})
    return [_fmt(step0.get("tau_sim")), _fmt(best.get("tau_sim")), _fmt(best.get("step")), "-",
            _fmt(step0.get("loss")), "-"]


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


def plot(runs: list[Run], out: Path) -> None:
    """Val tau_sim and val loss against step for every run; per-position accuracy of the best run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = differing_keys(runs)
    evaluated = [r for r in rank(runs) if r.val_rows]
    if not evaluated:
        raise SystemExit("error: no run has val rows to plot")
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
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
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3.compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs or sweep dirs")
    parser.add_argument("--format", choices=["plain", "markdown", "csv"], default="plain")
    parser.add_argument("--plot", type=Path, help="write a PNG of the val curves here")
    parser.add_argument("--baseline", help="a run's label (first column, e.g. '#0'): adds the step at which each "
                                           "run first reached that run's best tau_sim")
    args = parser.parse_args(argv)
    runs = find_runs(args.paths)
    sys.stdout.write(render(*table(runs, args.baseline), args.format))
    if args.plot:
        plot(runs, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
