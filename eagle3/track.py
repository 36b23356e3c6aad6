"""Run tracking on rank 0: `metrics.jsonl` always, wandb as `logger.mode` says, `summary.json` at the end (with
the provenance of eagle3/provenance.py).

Rows are flat: {"step", "split", "epoch", "loss", "loss_0", "full_acc_0", ...}; wandb gets the same
numbers as `<split>/<name>` at the same step. The wandb run is finished on exit, also on error, so a
multirun never leaks one job's run into the next. Its id is kept in `<run_dir>/wandb_run_id`, so a resumed
run continues the same wandb run.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import IO, Any

from eagle3.config import LoggerConfig, LoggerMode, RunInfo
from eagle3.progress import RunSummary


class Tracker:
    """`logger` says whether and where wandb logs; `run` (name, group, group choices) and `config` (the plain
    resolved config, shown in wandb) are what a wandb run is created with."""

    def __init__(self, run_dir: Path, logger: LoggerConfig, run: RunInfo | None = None,
                 config: dict[str, Any] | None = None, enabled: bool = True, resume_step: int | None = None):
        self.run_dir = run_dir
        self.logger, self.run, self.config = logger, run, config
        self.enabled = enabled
        self.resume_step = resume_step
        self._file: IO[str] | None = None
        self._wandb: Any = None

    def __enter__(self) -> Tracker:
        if not self.enabled:
            return self
        metrics = self.run_dir / "metrics.jsonl"
        if self.resume_step is not None and metrics.exists():
            # Rows logged after the checkpoint we resume from are replayed by the resumed run; a line cut short by
            # the kill (or a full disk) is dropped with them.
            kept = [line for line in metrics.read_text().splitlines() if _step_of(line) <= self.resume_step]
            tmp = metrics.with_name(".metrics.jsonl.tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, metrics)
        # wandb first: if it cannot start, no file is left open.
        if self.logger.mode != LoggerMode.disabled:
            self._wandb = self._init_wandb(self.logger)
        self._file = open(metrics, "a", encoding="utf-8")
        return self

    def _init_wandb(self, logger: LoggerConfig) -> Any:
        import wandb

        run = self.run
        if run is None:
            raise ValueError("a wandb run needs the job's RunInfo: pass run= to Tracker")
        id_file = self.run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        id_file.write_text(run_id + "\n")
        os.environ.setdefault("WANDB_SILENT", "true")
        return wandb.init(
            id=run_id,
            resume="allow",
            project=logger.project,
            entity=logger.entity,
            mode=logger.mode.value,
            dir=str(self.run_dir),
            name=run.name,
            group=run.group,
            job_type="train",
            tags=[f"{g}:{run.choices[g]}" for g in ("model", "data", "init", "optim")] + list(logger.tags),
            config=self.config,
        )

    def log(self, row: dict[str, Any]) -> None:
        if self._file is None:  # disabled (not rank 0), or used outside its `with`
            return
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb is not None:
            split = row["split"]
            self._wandb.log({f"{split}/{k}": v for k, v in row.items() if k not in ("step", "split")},
                            step=row["step"])

    def finish(self, summary: RunSummary) -> None:
        if not self.enabled:
            return
        from eagle3.provenance import provenance

        best = Path(summary.checkpoints["best"])
        record = summary.as_dict() | {"provenance": provenance(best if best.is_dir() else None)}
        (self.run_dir / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
        if self._wandb is not None:
            for which, row in (("best", summary.best), ("final", summary.final)):
                for k, v in row.items():
                    self._wandb.summary[f"{which}/{k}"] = v

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:
            self._wandb.finish(exit_code=0 if exc_type is None else 1)


def _step_of(line: str) -> float:
    """The step of a metrics.jsonl row; infinity for a line that is not a whole row (never kept on resume)."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf
