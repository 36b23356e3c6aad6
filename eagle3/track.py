"""Run tracking on rank 0: `metrics.jsonl` always, wandb as `logger.mode` says, a summary at the end.

Rows are flat: {"step", "split", "epoch", "loss", "loss_0", "full_acc_0", ...}; wandb gets the same
numbers as `<split>/<name>` at the same step. The wandb run is finished on exit, also on error, so a
multirun never leaks one job's run into the next.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class Tracker:
    def __init__(self, run_dir: Path, cfg: dict[str, Any], enabled: bool = True):
        self.run_dir = run_dir
        self.cfg = cfg
        self.enabled = enabled
        self._file = None
        self._wandb = None

    def __enter__(self) -> "Tracker":
        if not self.enabled:
            return self
        self._file = open(self.run_dir / "metrics.jsonl", "a", encoding="utf-8")
        logger = self.cfg["logger"]
        if logger["mode"] != "disabled":
            import wandb

            run = self.cfg["run"]
            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(
                project=logger["project"],
                entity=logger["entity"],
                mode=logger["mode"],
                dir=str(self.run_dir),
                name=run["name"],
                group=run["group"],
                job_type="train",
                tags=[f"{g}:{c}" for g, c in run["choices"].items()] + list(logger["tags"]),
                config=self.cfg,
            )
        return self

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        if self._wandb is not None:
            split = row["split"]
            self._wandb.log({f"{split}/{k}": v for k, v in row.items() if k not in ("step", "split")},
                            step=row["step"])

    def finish(self, summary: dict[str, Any]) -> None:
        if not self.enabled:
            return
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if self._wandb is not None:
            for which in ("best", "final"):
                for k, v in (summary.get(which) or {}).items():
                    self._wandb.summary[f"{which}/{k}"] = v

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._file is not None:
            self._file.close()
        if self._wandb is not None:
            self._wandb.finish(exit_code=0 if exc_type is None else 1)


def format_result_table(summary: dict[str, Any], ttt_steps: int) -> str:
    """Step 0 against final against best: the numbers a user looks at after a run."""
    cols = [("step 0", summary["step0"]), ("final", summary["final"]), ("best", summary["best"])]
    keys = ["step", "loss", "tau_sim"] + [f"full_acc_{k}" for k in range(ttt_steps)]
    lines = [f"{'val':<12}" + "".join(f"{name:>12}" for name, _ in cols)]
    for key in keys:
        cells = []
        for _, row in cols:
            v = row.get(key)
            cells.append(f"{v:>12}" if isinstance(v, int) else f"{v:>12.4f}" if v is not None else f"{'-':>12}")
        lines.append(f"{key:<12}" + "".join(cells))
    return "\n".join(lines)
