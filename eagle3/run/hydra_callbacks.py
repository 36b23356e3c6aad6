"""Checks Hydra runs before it creates anything: Hydra makes the run dir (or sweep dir) and writes `.hydra/`
into it before the task function starts, so an unusable output dir would otherwise end in its traceback.
Registered in conf/hydra/default.yaml; imports nothing heavy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from eagle3.rundir.files import SweepIndex, output_dir_problem


class CheckOutputDir(Callback):
    """Refuses an unusable hydra.run.dir / hydra.sweep.dir with one message, before Hydra creates it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")
        if not OmegaConf.select(config, "resume"):
            # The launcher's own check, here before Hydra rewrites the run's .hydra/ (the launcher runs too late).
            from eagle3.errors import UserError
            from eagle3.rundir.files import RunDir

            try:
                RunDir(Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute()).refuse_to_overwrite()
            except UserError as e:
                raise SystemExit(f"error: {e}") from None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.sweep.dir")
        sweep_dir = Path(str(OmegaConf.select(config, "hydra.sweep.dir"))).absolute()
        continues = "optuna" in str(OmegaConf.select(config, "hydra.sweeper._target_") or "")
        if not continues and SweepIndex(sweep_dir).exists():
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
