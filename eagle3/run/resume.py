"""`python launch.py resume=<run dir>`: the run's own resolved_config.yaml through today's schemas and checks, under
the run dir's lock, against what its checkpoints/last was trained with; for a run that completed, a note that
there is nothing to resume; for one stopped before its first step, the same run started again from step 0.

Imports torch (eagle3/init/checkpoint.py) only once the run dir is held.
"""

from __future__ import annotations

import logging
from pathlib import Path

from eagle3.config import RunConfig, plain_config, validate
from eagle3.errors import CheckpointError, ConfigError
from eagle3.run.plan_guard import check_devices, check_new_job
from eagle3.rundir.files import (
    CHECKPOINTS,
    METRICS,
    RESOLVED_CONFIG,
    SUMMARY,
    RunDir,
    config_changes,
    todays_layout,
    trained_config,
)

log = logging.getLogger(__name__)


class AlreadyComplete(Exception):
    """A resume of a run that has completed: nothing to train (not a failure, exit status 0)."""


def raise_if_complete(room: RunDir) -> None:
    """Raises AlreadyComplete when the run completed: its summary.json, written once the last step's val pass and
    save are done, is of the step its checkpoints/last holds."""
    from eagle3.init.checkpoint import load_trainer_state, resumable_last

    summary = room.read_summary()
    step = load_trainer_state(resumable_last(room.file(CHECKPOINTS)), mmap=True)["progress"]["step"]
    if summary.steps == step:
        room.clear_failure()  # a record left by an earlier attempt: the run completed since (README's contract)
        best = summary.best
        raise AlreadyComplete(f"{room.path} is already complete: it trained all its {step} steps (summary.json; best "
                              f"val tau_sim {best.get('tau_sim', float('nan')):.4f} at step {best.get('step')}); "
                              f"nothing to resume, nothing was trained. Its checkpoints: "
                              f"{room.file(CHECKPOINTS) / 'best'} and {room.file(CHECKPOINTS) / 'last'}")


def restart(room: RunDir) -> RunConfig:
    """A run stopped (or failed) before its first step has nothing to continue: it starts again from step 0 in its
    own dir with its own config, checked as a new run's; the step-0 val row it may have logged goes (the run logs
    its own again), its other files are rewritten as the run goes."""
    run_cfg = room.typed_config()
    check_new_job(run_cfg)
    log.info("%s stopped before its first step: starting it again from step 0 with its own config", room.path)
    if run_cfg.distributed.node_rank == 0:
        room.file(METRICS).unlink(missing_ok=True)
    return run_cfg


def load_for_resume(run_dir: Path, hydra) -> RunConfig:
    """The run's own resolved config, through the same schemas and checks as a fresh run's; resuming changes
    nothing about the run."""
    others = [o for o in hydra.overrides.task if not o.startswith(("resume=", "hydra."))]
    if others:
        raise ConfigError(f"resume continues a run with its own resolved_config.yaml and takes no other "
                          f"overrides; remove: {' '.join(others)}")
    room = RunDir(run_dir)
    if room.read_config().get("distributed", {}).get("node_rank", 0) == 0:
        room.hold(resuming=True).refuse_links()  # before any rank starts: a link leading out is never written
    if room.file(SUMMARY).is_file():
        raise_if_complete(room)
    if not room.took_a_step():
        return restart(room)
    if not room.last_saved():
        raise CheckpointError(f"resume: {run_dir} took steps (metrics.jsonl) and saved no checkpoints/last: there "
                              f"is nothing to continue from; start a new run in another dir")
    run_cfg = room.typed_config(resume=str(run_dir))  # before torch is imported: a refused file answers fast
    from eagle3.init.checkpoint import load_trainer_state, resumable_last

    last = resumable_last(run_dir / CHECKPOINTS)  # whole, or restored from a save stopped between its renames
    log.info("resuming %s", run_dir)
    trained = load_trainer_state(last, mmap=True).get("config")
    if trained is not None:  # through today's schemas, as the run's own config: an older layout compares as itself
        trained = trained_config(plain_config(validate(todays_layout(trained), dataset_required=False)))
    changes = config_changes(trained, trained_config(plain_config(run_cfg))) if trained is not None else []
    if changes:  # e.g. fewer ranks (another global batch), or an lr the restored scheduler would not train at
        raise ConfigError(f"resume: {run_dir / RESOLVED_CONFIG} no longer says what {last} was trained with: "
                          f"{'; '.join(changes)}. Restore those values to continue the run, or start a new one")
    check_devices(run_cfg)
    return run_cfg
