"""Checks Hydra runs before it creates anything: Hydra makes the run dir (or sweep dir) and writes `.hydra/`
into it before the task function starts, so an unusable output dir would otherwise end in its traceback.
A new run's dir is also taken here, before Hydra writes into it (`take_run_dir`).
Registered in conf/hydra/default.yaml; imports nothing heavy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from eagle3.rundir.files import output_dir_problem
from eagle3.rundir.sweep_index import SweepIndex


class CheckOutputDir(Callback):
    """Refuses an unusable hydra.run.dir / hydra.sweep.dir with one message, before Hydra creates it."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        self._check(config, "hydra.run.dir")
        if not OmegaConf.select(config, "resume"):
            take_run_dir(config)

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


def take_run_dir(config: DictConfig) -> None:
    """A new run's dir, refused or taken before Hydra writes `.hydra/` into it and opens its launch.log (the
    launcher runs after that): a dir another process holds (a run still building its data, a resume, a serve), seen
    without writing anything there, or one that already holds a run; then this process holds its lock, so that a
    second command into the same dir (started in the same second) is refused before it writes anything. On nodes
    other than node 0 of a multi-node job node 0 holds the dir."""
    from eagle3.errors import UserError
    from eagle3.rundir.files import RunDir

    room = RunDir(Path(str(OmegaConf.select(config, "hydra.run.dir"))).absolute())
    try:
        node_rank = OmegaConf.select(config, "distributed.node_rank", default=0)
    except Exception:  # noqa: BLE001 - an unresolvable value: the config check names it, after this
        node_rank = 0
    try:
        if node_rank in (0, None):
            room.refuse_if_in_use()
        room.refuse_to_overwrite()
        if node_rank in (0, None):
            room.hold()
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
