"""The Optuna study a sweep dir holds (hydra/sweeper=optuna keeps it in `<sweep dir>/study.db`), as the run side
sees it: a stopped trial resumed to its end is told to the study here. Optuna is imported only when a study is
there."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import OmegaConf

log = logging.getLogger(__name__)

STUDY_FILE = "study.db"


def tell_resumed_trial(sweep_dir: Path, number: int, value: float | None) -> None:
    """A stopped trial's run resumed to its end (`resume=<its run dir>`): the study in its sweep dir is told its
    value, or FAIL for None (the resumed run failed). Only a trial the study still holds as RUNNING can be told."""
    import optuna

    multirun = sweep_dir / "multirun.yaml"  # the sweep's config, as the sweeper saved it
    sweep = OmegaConf.load(multirun) if multirun.is_file() else OmegaConf.create()
    storage = OmegaConf.select(sweep, "hydra.sweeper.storage", default=None)
    name = OmegaConf.select(sweep, "hydra.sweeper.study_name", default=None)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name=name or "eagle3", storage=storage or f"sqlite:///{sweep_dir / STUDY_FILE}")
    trial = next((t for t in study.get_trials(deepcopy=False) if t.number == number), None)
    if trial is None or trial.state != optuna.trial.TrialState.RUNNING:
        state = trial.state.name if trial else "not in it"
        log.warning("trial %d of the study in %s is %s: the resumed run's result is not told to it", number,
                    sweep_dir, state)
        return
    if value is None:
        study.tell(number, state=optuna.trial.TrialState.FAIL)
    else:
        study.tell(number, value)
    log.info("trial %d of the study in %s told %s", number, sweep_dir, "FAIL" if value is None else f"{value:.4f}")
