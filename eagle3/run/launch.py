"""What launch.py does with a composed config: resolve it, type and check it once (eagle3/config/'s
`run_config`), plan it (eagle3/plan/memory.py: refuse what cannot fit; plan=true prints the plan and stops), write the
run dir (eagle3/rundir/files.py), build and check the inputs (eagle3/run/inputs.py), then run the rank in this process
or start the ranks (eagle3/run/elastic.py). How the job ended is recorded by eagle3/run/job_outcome.py. Past
`run_config` the run config is a typed `RunConfig`, the one object the run dir's resolved_config.yaml, the ranks and
the loop read.

In a multirun each job passes through here in turn (Hydra's basic launcher), so each job gets fresh rank
processes, its own run dir and its own wandb run, and a failed job is recorded and the sweep goes on.
Nothing here imports torch or speculators before the config is known to be good.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from eagle3.config import RunConfig, lr_advice, plain_config, run_config
from eagle3.errors import ConfigError, Interrupted, StoppedBeforeTraining, UserError
from eagle3.run.job_outcome import JobOutcome
from eagle3.run.plan_guard import check_new_job, refuse_if_it_cannot_fit, run_plan
from eagle3.run.resume import AlreadyComplete, load_for_resume
from eagle3.rundir.files import RunDir
from eagle3.rundir.progress import job_clock, start_job
from eagle3.rundir.rank_errors import RankFailed
from eagle3.signal_scope import raising_on
from eagle3.sweep.objective import objective_value
from eagle3.verifier.shape import check_verifier_dir, unresolvable

if TYPE_CHECKING:
    from eagle3.rundir.progress import RunSummary

log = logging.getLogger(__name__)


def launch(cfg: DictConfig) -> float | None:
    """Runs one job; returns its objective (cfg.objective: best val tau_sim or accept_len) for a sweeper. SIGTERM or
    Ctrl-C at any moment of it stops it with one line (`stopped_line`); the training loop's own handler takes over
    from its first step to its last (it saves checkpoints/last). `JobOutcome.stop_line` is the line."""
    hydra = HydraConfig.get()
    try:
        with raising_on((signal.SIGTERM, signal.SIGINT), lambda sig: StoppedBeforeTraining(sig, "running the job")):
            return run_one_job(cfg, hydra)
    finally:
        # A resumed run logs into its own dir, and a refused config wrote nothing: the dir Hydra made for this
        # command then holds only its own files and goes (a run, or a sweep job's failure.json, keeps it).
        remove_if_only_hydras(hydra)


def run_one_job(cfg: DictConfig, hydra) -> float | None:
    run_dir = Path(cfg.resume if cfg.resume else hydra.runtime.output_dir).resolve()
    clock = start_job()  # where the job's time goes (summary.json's phases_s); from the process's start
    job = JobOutcome.of(hydra, run_dir, resume=bool(cfg.resume))
    try:
        if cfg.plan:  # print the memory/time plan and stop; no run dir, nothing built
            show_plan(cfg, hydra, run_dir)
            return None
        try:
            run_cfg = load_for_resume(run_dir, hydra) if cfg.resume else fresh_run(cfg, hydra, run_dir)
        except AlreadyComplete as done:
            print(done, flush=True)
            return None
        job.ours = True  # the run dir is this run's: from here on a failure is recorded in it
        if cfg.resume:  # its log goes on in its own launch.log
            from eagle3.console import append_log  # never through a link (RunDir.refuse_links refused those out)

            append_log(run_dir, "launch.log", "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
        summary = run_with_inputs(run_cfg)
        # Inside the try: a run whose best val pass has no accept_len is a failed trial, recorded as such.
        objective = objective_value(run_cfg.objective, summary.best) if summary is not None else None
    except StoppedBeforeTraining as e:
        job.interrupted()
        print(job.stop_line(e), file=sys.stderr, flush=True)
        raise
    except Interrupted:
        job.stopped()
        raise
    except Exception as e:
        job.failed(e)
        if isinstance(e, (UserError, RankFailed)) and not job.multirun and os.environ.get("HYDRA_FULL_ERROR") != "1":
            raise SystemExit(f"error: {e}") from None  # one message on the console, no traceback
        raise
    if summary is None:  # a node other than node 0 of a multi-node job: node 0 writes the results
        return None
    job.completed(summary, objective)
    log.info("done in %.1f s", clock.wall())
    if run_cfg.eval.serve.enabled:
        serve_at_end(run_dir, run_cfg, job.multirun, hydra.job.num if job.multirun else 0)
    return objective


def serve_at_end(run_dir: Path, run_cfg: RunConfig, multirun: bool, job_num: int) -> None:
    """eval.serve: serves the finished run's best checkpoint; a failure keeps the run's results (a sweep goes on)."""
    from eagle3.serve.after_training import serve_finished_run

    try:
        serve_finished_run(run_dir, run_cfg.eval, run_cfg.seed)
    except UserError as e:
        if multirun:
            log.error("job %d: serving (eval.serve) failed: %s", job_num, e)
        else:
            raise SystemExit(f"error: the run completed ({run_dir}), serving it failed (eval.serve): {e}") from None


def run_with_inputs(run_cfg: RunConfig) -> RunSummary | None:
    """Builds and checks the run's inputs before any rank starts, then runs the ranks; rank 0's summary."""
    from eagle3.run.elastic import run_job
    from eagle3.run.inputs import check_data, materialize_inputs, preflight, refuse_zero_steps
    from eagle3.serve.after_training import check_engine
    from eagle3.train.stop import stop_before_training  # torch: only once the config is known to be good
    from eagle3.train.track import check_wandb

    if run_cfg.distributed.node_rank == 0:  # wandb logs, and eval.serve serves, from global rank 0 on node 0
        check_wandb(run_cfg.logger)  # an account and a network, before any data is built
        check_engine(run_cfg.eval)
    with stop_before_training("building and checking the run's verifier and data"), job_clock().phase("data build"):
        verifier_dir, data_dir = materialize_inputs(run_cfg)
        rows = check_data(run_cfg, verifier_dir, data_dir)
        refuse_zero_steps(run_cfg, data_dir, rows)
    if not run_cfg.resume:
        preflight(run_cfg, verifier_dir, data_dir)
    return run_job(run_cfg, verifier_dir, data_dir, rows)


def fresh_run(cfg: DictConfig, hydra, run_dir: Path) -> RunConfig:
    """The typed run config of a new run, checked, and written to the run dir as resolved_config.yaml: the plain form
    of the typed config the ranks are handed (what runs, with the schemas' types), not of the composition."""
    run_cfg = run_config(resolve(cfg, hydra, run_dir))
    check_new_job(run_cfg)
    refuse_if_it_cannot_fit(run_cfg)  # before anything is written or any rank starts
    advice, outside = lr_advice(run_cfg.optim, run_cfg.init)
    (log.warning if outside else log.info)(advice)
    if run_cfg.distributed.node_rank == 0:
        room = RunDir(run_dir)
        room.keep()
        room.refuse_to_overwrite()
        room.write_config(plain_config(run_cfg))
    return run_cfg


def resolve(cfg: DictConfig, hydra, run_dir: Path) -> dict[str, Any]:
    """The plain, fully resolved config plus what Hydra knows about this job (group choices, overrides)."""
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} is required and has no value: set it, e.g. `{e.full_key}=...`") from None
    except InterpolationResolutionError as e:  # e.g. model=auto without the verifier's config.json
        raise ConfigError(unresolvable(e)) from None
    assert isinstance(container, dict)
    resolved = {str(k): v for k, v in container.items()}
    resolved = {**resolved, **absolute_paths(resolved)}
    choices = {g: c for g, c in hydra.runtime.choices.items() if not g.startswith("hydra") and c is not None}
    multirun = hydra.mode is not None and hydra.mode.name == "MULTIRUN"
    name = hydra.job.override_dirname or run_dir.name
    resolved["run"] = {
        "dir": str(run_dir),
        "name": name,
        # Every job of a sweep shares its group in wandb: the sweep dir, unique per sweep.
        "group": f"{Path(hydra.sweep.dir).parent.name}_{Path(hydra.sweep.dir).name}" if multirun else name,
        "choices": choices,
        "overrides": list(hydra.overrides.task),
    }
    return resolved


def absolute_paths(plain: dict[str, Any]) -> dict[str, Any]:
    """The parts of the config whose paths are relative to where launch.py ran, with those paths made absolute, so
    that the run dir's resolved_config.yaml means the same files wherever `resume=` is run from."""
    def absolute(part: Any, *keys: str) -> Any:
        if not isinstance(part, dict):
            return part
        key, rest = keys[0], keys[1:]
        value = part.get(key)
        if rest:
            return {**part, key: absolute(value, *rest)}
        return {**part, key: os.path.abspath(value)} if isinstance(value, str) and value else part

    out = {"data": absolute(plain.get("data"), "path"), "init": absolute(plain.get("init"), "path"),
           "model": absolute(plain.get("model"), "verifier", "path"),
           "eval": absolute(plain.get("eval"), "accept", "prompts")}
    if isinstance(plain.get("cache_dir"), str):
        out["cache_dir"] = os.path.abspath(plain["cache_dir"])
    return {k: v for k, v in out.items() if v is not None}


def show_plan(cfg: DictConfig, hydra, run_dir: Path) -> None:
    """`plan=true`: types and checks the config as a run would, except that data.path need not hold a dataset yet
    (a plan reads no data), prints the plan, and removes the run dir Hydra made for this job when nothing but
    Hydra's own files is in it, also when the config is refused. With `resume=<run dir>`: the plan of that run,
    from its own config."""
    from eagle3.plan.report import NO_FIT_STATUS, check_fits, format_plan

    try:
        if cfg.resume:
            run_cfg = RunDir(cfg.resume).typed_config(dataset_required=False)
        else:
            run_cfg = run_config(resolve(cfg, hydra, run_dir), dataset_required=False)
            check_verifier_dir(run_cfg.model)
        plan = run_plan(run_cfg, measure=True)
        print(format_plan(plan), flush=True)
        try:
            check_fits(plan)
        except ConfigError as e:  # printed as a run would refuse it; its own status, so that a script can gate
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(NO_FIT_STATUS) from None
    finally:
        remove_if_only_hydras(hydra)


def remove_if_only_hydras(hydra) -> None:
    """Removes the run dir Hydra made for a job that wrote nothing into it, and Hydra's date dir above it when that
    is then empty; never the dir above a run dir the command named (hydra.run.dir, hydra.sweep.dir), which may be
    the user's own, even their working directory."""
    from eagle3 import safe_write
    from eagle3.rundir.files import LOCK

    hydra_dir, job_name = Path(hydra.runtime.output_dir), hydra.job.name
    ours = {".hydra", f"{job_name}.log"} | ({LOCK} if safe_write.holds(hydra_dir / LOCK) else set())
    if hydra_dir.is_dir() and {p.name for p in hydra_dir.iterdir()} <= ours:
        import shutil

        safe_write.release(hydra_dir / LOCK)
        shutil.rmtree(hydra_dir)
        named = any(o.split("=", 1)[0].lstrip("+~") in ("hydra.run.dir", "hydra.sweep.dir")
                    for o in hydra.overrides.hydra)
        if not named:
            try:
                hydra_dir.parent.rmdir()  # Hydra's date dir, when this was its only run
            except OSError:
                pass
