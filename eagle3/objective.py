"""What a run returns to a sweeper (the top-level `objective` key): its best val tau_sim, or the measured
acceptance of the checkpoint it ships (`checkpoints/best`, chosen by tau_sim), from the run's summary."""

from __future__ import annotations

from typing import Any

from eagle3.config import ConfigError


def check_objective(objective: str, accept_enabled: bool, accept_every: int) -> None:
    """accept_len exists only where the val pass that chose the best checkpoint measured acceptance."""
    if objective == "accept_len" and not (accept_enabled and accept_every == 1):
        raise ConfigError("objective=accept_len needs measured acceptance at every val pass: add "
                          "eval.accept.enabled=true" + ("" if accept_every == 1 else " and eval.accept.every=1")
                          + ", or use objective=tau_sim")


def objective_value(objective: str, best_row: dict[str, Any]) -> float:
    """The objective of a finished run, from the val row of its best checkpoint (summary.json's `best`)."""
    if objective == "tau_sim":
        return best_row["tau_sim"]
    value = best_row.get("accept_len")
    if value is None:  # the lossless check failed at that pass (logged), or measuring was off
        raise ConfigError(f"objective=accept_len: the val pass at step {best_row.get('step')} has no accept_len "
                          f"(accept_lossless: {best_row.get('accept_lossless')}); see the run's log")
    return value
