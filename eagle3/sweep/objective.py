"""What a finished run returns to a sweeper (the top-level `objective` key): its best val tau_sim, or the
measured acceptance of the checkpoint it ships (`checkpoints/best`, chosen by tau_sim), from its summary's best
val row. TrainConfig.check() refuses accept_len where acceptance is not measured at every val pass."""

from __future__ import annotations

from eagle3.config import Objective
from eagle3.errors import ConfigError
from eagle3.rundir.progress import Row


def objective_value(objective: Objective, best: Row) -> float:
    """The objective of a finished run, from the val row of its best checkpoint (RunSummary.best)."""
    if objective == Objective.tau_sim:
        return float(best["tau_sim"])
    value = best.get("accept_len")
    if value is None:  # the lossless check failed at that pass (logged), or measuring was off
        raise ConfigError(f"objective=accept_len: the val pass at step {best.get('step')} has no accept_len "
                          f"(accept_lossless: {best.get('accept_lossless')}); see the run's log")
    return float(value)
