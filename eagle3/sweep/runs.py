"""The runs `eagle3 compare` reads, from their run dirs alone: a run dir, or a sweep dir holding run dirs; a run that
failed, never finished or cannot be read whole is one too, marked so."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from eagle3.errors import ConfigError
from eagle3.rundir.files import FAILURE, RESOLVED_CONFIG, SUMMARY, RunDir, flatten, todays_layout

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
            raise ConfigError(f"{path} is not a directory")
        if _is_run_dir(path):
            dirs.append(path)
            continue
        found = sorted((d for d in path.iterdir() if d.is_dir() and _is_run_dir(d)), key=_job_order)
        if not found:
            raise ConfigError(f"{path} holds no run dirs (no resolved_config.yaml or failure.json in it "
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
    config = flatten(todays_layout(config)) if isinstance(config, dict) else {}
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
