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

from eagle3 import safe_write
from eagle3.config import LoggerConfig, LoggerMode, RunInfo
from eagle3.errors import ConfigError
from eagle3.rundir.files import RunDir
from eagle3.rundir.progress import RunSummary

OFFLINE_ADVICE = ("or use logger.mode=offline (wandb sync <run_dir>/wandb/offline-run-* later) or "
                  "logger.mode=disabled")
CONNECT_TIMEOUT_S = 5.0


def check_wandb(logger: LoggerConfig) -> None:
    """logger.mode=online needs a wandb API key and wandb's server: both checked before anything is built (wandb
    itself would find out after the data build, and 90 s into its init without a network). The key is looked up
    as wandb looks it up (WANDB_API_KEY, ~/.netrc from `wandb login`, its settings), without a network call; the
    server with one bounded TCP connect."""
    if logger.mode != LoggerMode.online:
        return
    from wandb.errors import AuthenticationError
    from wandb.sdk import wandb_setup
    from wandb.sdk.lib.wbauth.authenticate import authenticate_session

    base_url = wandb_setup.singleton().settings.base_url
    try:
        auth = authenticate_session(host=base_url, source="eagle3", prompt=False, update_session=False)
    except AuthenticationError as e:
        raise ConfigError(f"logger.mode=online: wandb's API key is not usable ({e}); run `wandb login`, "
                          f"{OFFLINE_ADVICE}") from None
    if auth is None:
        raise ConfigError(f"logger.mode=online: no wandb API key for {base_url} (none in WANDB_API_KEY, ~/.netrc or "
                          f"wandb's settings); run `wandb login` or set WANDB_API_KEY, {OFFLINE_ADVICE}")
    problem = unreachable(base_url)
    if problem:
        raise ConfigError(f"logger.mode=online: wandb's server {base_url} cannot be reached ({problem}); check the "
                          f"network (or WANDB_BASE_URL), {OFFLINE_ADVICE}")


def unreachable(url: str) -> str | None:
    """Why a TCP connection to `url`'s host cannot be opened within CONNECT_TIMEOUT_S, or None. Behind a proxy
    (the *_PROXY variables) the host is reached through it, so nothing is probed."""
    import socket
    from urllib.parse import urlsplit

    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY")):
        return None
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((parts.hostname or "", port), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as e:
        return str(e) or type(e).__name__
    return None


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
            safe_write.write_text(self.run_dir, metrics, "".join(line + "\n" for line in kept))
        # wandb first: if it cannot start, no file is left open (and a link in the way is refused before it starts).
        safe_write.refuse_links(self.run_dir, metrics)
        if self.logger.mode != LoggerMode.disabled:
            self._wandb = self._init_wandb(self.logger)
        self._file = safe_write.open_write(self.run_dir, metrics, "a")
        return self

    def _init_wandb(self, logger: LoggerConfig) -> Any:
        import wandb

        run = self.run
        if run is None:
            raise ValueError("a wandb run needs the job's RunInfo: pass run= to Tracker")
        id_file = self.run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.exists() else uuid.uuid4().hex[:12]
        safe_write.write_text(self.run_dir, id_file, run_id + "\n")
        os.environ.setdefault("WANDB_SILENT", "true")
        try:
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
        except (wandb.errors.CommError, wandb.errors.UsageError) as e:  # check_wandb ran: the network went away
            raise ConfigError(f"logger.mode={logger.mode.value}: wandb could not start its run ({e}); "
                              f"{OFFLINE_ADVICE}") from None

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
        from dataclasses import replace

        from eagle3.provenance import provenance

        best = self.run_dir / summary.checkpoints["best"]
        summary = replace(summary, provenance=provenance(best if best.is_dir() else None))
        RunDir(self.run_dir).write_summary(summary)  # whole or not at all
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
