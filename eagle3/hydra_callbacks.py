"""Checks Hydra runs before it creates anything: Hydra makes the run dir (or sweep dir) and writes `.hydra/`
into it before the task function starts, so an unusable output dir would otherwise end in its traceback.
Registered in conf/hydra/default.yaml; imports nothing heavy."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf


def output_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be a run's output dir (an existing file, or a dir or parent no file can be written
    in), or None. Probes by writing, so a read-only mount is caught for root too."""
    if path.exists() and not path.is_dir():
        return f"{path} is an existing file, not a directory"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{path} cannot be created: {existing} is a file"
    try:
        fd, probe = tempfile.mkstemp(prefix=".eagle3-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        return f"{path} {where} ({e.strerror})"
    return None


class CheckOutputDir(Callback):
    """Refuses an unusable hydra.run.dir / hydra.sweep.dir with one message, before Hydra creates it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")
        if not OmegaConf.select(config, "resume"):
            # The launcher's own check, here before Hydra rewrites the run's .hydra/ (the launcher runs too late).
            from eagle3.errors import UserError
            from eagle3.launch import refuse_to_overwrite

            try:
                refuse_to_overwrite(Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute())
            except UserError as e:
                raise SystemExit(f"error: {e}") from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))).absolute()
        continues = "optuna" in str(OmegaConf.select(config, "hydra.sweeper._target_") or "")
        if not continues and (sweep_dir / "index.json").exists():
            # A second grid in the same dir would renumber its jobs from 0 over the first one's entries.
            raise SystemExit(f"error: {sweep_dir} already holds a sweep (index.json); nothing was overwritten: "
                             f"choose another hydra.sweep.dir")

    @staticmethod
    def _check(config: DictConfig, key: str) -> None:
        value = OmegaConf.select(config, key)
        if value is None:
            return
        problem = output_dir_problem(Path(str(value)).absolute())
        if problem:
            raise SystemExit(f"error: {key}: {problem}; choose another {key}")
