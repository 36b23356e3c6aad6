"""`hydra/sweeper=optuna`: an Optuna study over the sweep overrides, one Hydra job per trial.

    python launch.py -m hydra/sweeper=optuna hydra.sweeper.n_trials=12 \
        'optim.lr=tag(log, interval(1e-4, 1e-2))' 'optim.warmup_ratio=interval(0, 0.1)'

Ask-and-tell on Optuna's current API: each batch of `n_jobs` trials is asked from the study, launched by the
configured launcher (the basic one runs them in turn; submitit runs them at once) with job number = trial
number, and told the value each job returned (`objective`: the launcher returns the run's best val tau_sim
or its measured accept_len). A job that raises (its run dir has `failure.json`, the sweep index says
"failed") is told to the study as FAIL and the study goes on; the sweep exits non-zero at the end if any
trial failed. The study lives in `<sweep dir>/study.db` (SQLite), so the same command with the same
`hydra.sweep.dir` adds `n_trials` more trials to it; a different search space or different fixed overrides
there are refused rather than mixed into one study.

Before the study is opened, the configs at both ends of the search space are composed and checked as the
trials' will be: what every trial would fail on (a misspelt key, objective=accept_len without measured
acceptance) is one message and leaves nothing in the study. One study command at a time holds a sweep dir
(`study.lock`). A trial whose run is stopped by a signal saved `checkpoints/last`: it stays RUNNING in the study
until `python launch.py resume=<its run dir>` finishes it and tells the study its value (eagle3/sweep/study.py); a
signal between trials stops the sweep with exit status 128 + the signal, and the trials that did not run are
told FAIL and listed as "interrupted" in the sweep index.

Why not hydra-optuna-sweeper: its releases pin optuna < 3 (2.10), which cannot open an SQLite study with
the SQLAlchemy 2 that installs today, and it numbers jobs from 0 on every invocation, so a continued study
would reuse run-dir numbers and sweep-index entries.
"""

# No `from __future__ import annotations`: Hydra executes plugin modules before they are in sys.modules,
# where dataclasses cannot resolve string annotations.
import fcntl
import logging
import math
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from eagle3.rundir.sweep_index import IndexEntry, SweepIndex
from eagle3.sweep.study import STUDY_FILE  # in the sweep dir; eagle3.sweep.compare reads the study's history from it

from .search_space import parse_search_space, to_override

log = logging.getLogger(__name__)



@dataclass
class OptunaSweeperConf:
    """Schema of conf/hydra/sweeper/optuna.yaml, which documents each field."""

    _target_: str = "hydra_plugins.eagle3_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    n_trials: int = 12
    n_jobs: int = 1
    direction: str = "maximize"
    seed: int = 0
    n_startup_trials: int = 5
    study_name: str = "eagle3"
    storage: str | None = None
    # {} rather than None: OmegaConf cannot merge a command-line `hydra.sweeper.params={...}` into a None node.
    params: dict[str, str] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="eagle3_optuna", node=OptunaSweeperConf, provider="eagle3")


class SweepError(Exception):
    """A sweep that cannot start or go on as asked; one message, no traceback."""


class OptunaSweeper(Sweeper):
    def __init__(self, n_trials: int, n_jobs: int, direction: str, seed: int, n_startup_trials: int,
                 study_name: str, storage: str | None, params: dict[str, str] | None) -> None:
        self.n_trials, self.n_jobs, self.direction, self.seed = n_trials, n_jobs, direction, seed
        self.n_startup_trials, self.study_name, self.storage = n_startup_trials, study_name, storage
        self.params = dict(params or {})
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> list[JobReturn]:
        try:
            return self._sweep(arguments)
        except SweepError as e:
            raise SystemExit(f"error: {e}") from None

    def _sweep(self, arguments: list[str]) -> list[JobReturn]:
        assert self.config is not None and self.launcher is not None
        self._check_settings()
        try:
            space, fixed = parse_search_space([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        except ValueError as e:  # an empty range, a sweep kind Optuna has no distribution for
            raise SweepError(str(e)) from None
        if not space:
            raise SweepError("hydra/sweeper=optuna needs a search space: at least one override such as "
                             "'optim.lr=tag(log, interval(1e-5, 1e-2))', 'optim.warmup_ratio=interval(0, 0.1)' "
                             "or 'optim.scheduler=choice(cosine, linear)'")
        self._check_before_trials(space, fixed)
        sweep_dir = Path(self.config.hydra.sweep.dir).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with hold_study_dir(sweep_dir), stop_between_trials():
            OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
            study = self._open_study(sweep_dir, space, fixed)
            return self._run_trials(study, space, fixed, sweep_dir)

    def _run_trials(self, study, space: dict[str, Any], fixed: list[str], sweep_dir: Path) -> list[JobReturn]:
        import optuna

        assert self.launcher is not None
        returns: list[JobReturn] = []
        failures: list[str] = []
        asked = 0
        while asked < self.n_trials:
            pending: list[tuple[Any, list[str]]] = []  # asked and not yet told
            try:
                for _ in range(min(self.n_jobs, self.n_trials - asked)):
                    trial = study.ask(space)
                    pending.append((trial, [*fixed, *(to_override(k, v) for k, v in trial.params.items())]))
                asked += len(pending)
                trials, batch = [t for t, _ in pending], [o for _, o in pending]
                try:  # a sampled value of the wrong type fails composition, before any job starts
                    self.validate_batch_is_legal(batch)
                except Exception as e:
                    for trial in trials:
                        study.tell(trial, state=optuna.trial.TrialState.FAIL)
                    cause = f"\n{e.__cause__}" if e.__cause__ else ""
                    raise SweepError(f"trial {trials[0].number}: the sampled overrides do not compose: {e}{cause}\n"
                                     "(int(interval(a, b)) samples integers)") from None
                # Job number = trial number: run dirs and sweep-index entries stay unique across continuations.
                first = trials[0].number
                assert [t.number for t in trials] == list(range(first, first + len(trials))), "asked out of order"
                results = self.launcher.launch(batch, initial_job_idx=first)
            except SystemExit:  # a signal: during a trial's run (Interrupted), or between trials
                settle_stopped(study, pending, sweep_dir)
                raise
            for trial, result in zip(trials, results):
                failure = self._tell(study, trial, result)
                if failure:
                    failures.append(failure)
            returns.extend(results)

        self._log_best(study)
        if failures:
            raise SweepError(f"{len(failures)} of {asked} trials failed (failure.json in their run dirs, "
                             f"'failed' in {sweep_dir / 'index.json'}, FAIL in the study):\n  " + "\n  ".join(failures))
        return returns

    def _check_before_trials(self, space: dict[str, Any], fixed: list[str]) -> None:
        """Composes and checks the configs at both ends of the search space as each trial's will be, before the
        study is opened: what every trial would fail on (a misspelt key, objective=accept_len without
        eval.accept.enabled=true) is one message and leaves nothing in the study. A problem at one end only is
        the sampled value's: such a trial fails on its own and the study goes on."""
        from hydra.core.hydra_config import HydraConfig

        from hydra_plugins.eagle3_basic_sweeper.sweeper import job_config_problem

        assert self.config is not None and self.hydra_context is not None
        saved = HydraConfig.instance().cfg
        problems = []
        try:
            for ends in _space_ends(space):
                overrides = [*fixed, *(to_override(k, v) for k, v in ends.items())]
                try:
                    job_cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
                except Exception as e:
                    cause = f"\n{e.__cause__}" if e.__cause__ else ""
                    raise SweepError(f"the search space does not compose at {' '.join(overrides)}: {e}{cause}\n"
                                     "nothing was added to the study") from None
                problem = job_config_problem(job_cfg)
                if problem is None:
                    return
                problems.append(problem)
        finally:
            if saved is not None:
                HydraConfig.instance().set_config(saved)
        raise SweepError(f"every trial would be refused (checked at both ends of the search space): {problems[0]}\n"
                         "nothing was added to the study")

    def _check_settings(self) -> None:
        if self.n_trials < 1:
            raise SweepError(f"hydra.sweeper.n_trials must be >= 1, got {self.n_trials}")
        if self.n_jobs < 1:
            raise SweepError(f"hydra.sweeper.n_jobs must be >= 1, got {self.n_jobs}")
        if self.direction not in ("maximize", "minimize"):
            raise SweepError(f"hydra.sweeper.direction must be maximize or minimize, got {self.direction}")
        if self.n_startup_trials < 0:
            raise SweepError(f"hydra.sweeper.n_startup_trials must be >= 0, got {self.n_startup_trials}")

    def _open_study(self, sweep_dir: Path, space: dict[str, Any], fixed: list[str]):
        """The sweep dir's study, created or continued; refused if it was run with another search space."""
        import optuna
        from optuna.distributions import distribution_to_json

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # this sweeper logs each trial itself
        storage = self.storage or f"sqlite:///{sweep_dir / STUDY_FILE}"
        study = optuna.create_study(storage=storage, study_name=self.study_name, direction=self.direction,
                                    load_if_exists=True)
        if study.direction.name.lower() != self.direction:
            raise SweepError(f"study {self.study_name} in {storage} maximises/minimises differently "
                             f"({study.direction.name.lower()}); hydra.sweeper.direction={self.direction}")
        setup = {"search_space": {k: distribution_to_json(d) for k, d in space.items()}, "fixed": sorted(fixed),
                 "objective": OmegaConf.select(self.config, "objective", default=None)}
        setup["objective"] = getattr(setup["objective"], "value", setup["objective"])  # the enum's name, tau_sim
        previous = {k: study.user_attrs[k] for k in setup if k in study.user_attrs}
        if previous and previous != setup:
            changed = [k for k in setup if previous.get(k) != setup[k]]
            raise SweepError(
                f"{storage} holds study {self.study_name} run with another {' and '.join(changed)}:\n"
                + "\n".join(f"  {k}: study has {previous.get(k)}, this command gives {setup[k]}" for k in changed)
                + "\ncontinue it with the same overrides, or give a new hydra.sweep.dir")
        for key, value in setup.items():
            study.set_user_attr(key, value)
        trials = study.get_trials(deepcopy=False)
        jobs = index_jobs(sweep_dir)
        for stale in (t for t in trials if t.state == optuna.trial.TrialState.RUNNING):
            # Nothing else runs this study (hold_study_dir): a trial still RUNNING belongs to a sweep that was
            # stopped. One whose run saved checkpoints/last stays RUNNING: resuming it tells the study its value.
            job = jobs.get(stale.number)
            if job is not None and job.status == "stopped":
                log.info("trial %d was stopped with checkpoints/last saved; %s finishes it and tells the study",
                         stale.number, job.resume)
                continue
            log.warning("trial %d was left running by an earlier sweep: told FAIL", stale.number)
            study.tell(stale.number, state=optuna.trial.TrialState.FAIL)
        # Seeded, and reseeded by the trials so far: a continued study samples new points, reproducibly.
        study.sampler = optuna.samplers.TPESampler(seed=self.seed + len(trials),
                                                   n_startup_trials=self.n_startup_trials)
        log.info("study %s (%s, %s): %d trials so far, %d to add; search space: %s", self.study_name, storage,
                 self.direction, len(trials), self.n_trials, ", ".join(f"{k} ~ {d}" for k, d in space.items()))
        return study

    def _tell(self, study, trial, result: JobReturn) -> str | None:
        """Tells the study what the job returned; returns a line describing the failure, if it failed."""
        import optuna

        run_dir = OmegaConf.select(result.hydra_cfg, "hydra.runtime.output_dir", default=None)
        trial.set_user_attr("run_dir", str(run_dir))
        problem = None
        if result.status != JobStatus.COMPLETED:
            try:
                _ = result.return_value  # re-raises the job's exception
            except Exception as e:
                problem = f"{type(e).__name__}: {e}"
            problem = problem or f"job status {result.status.name}"
        else:
            value = result.return_value
            if not isinstance(value, (int, float)) or not math.isfinite(value):
                problem = f"the job returned {value!r}, not a finite number"
        if problem is not None:
            trial.set_user_attr("error", problem)
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log.warning("trial %d failed: %s", trial.number, problem)
            return f"trial {trial.number} ({run_dir}): {problem.splitlines()[0]}"
        study.tell(trial, float(value))
        best = study.best_trial
        log.info("trial %d: %.4f (best so far %.4f, trial %d) with %s", trial.number, value, best.value,
                 best.number, _params_text(trial.params))
        return None

    def _log_best(self, study) -> None:
        try:
            best = study.best_trial
        except ValueError:  # no completed trial yet
            log.warning("study %s has no completed trial", self.study_name)
            return
        log.info("best of %d trials: %.4f, trial %d (%s): %s", len(study.trials), best.value, best.number,
                 best.user_attrs.get("run_dir", "?"), _params_text(best.params))


def _space_ends(space: dict[str, Any]) -> list[dict[str, Any]]:
    """The lowest and the highest value of every distribution (first and last choice), as two assignments."""
    from optuna.distributions import CategoricalDistribution

    ends: list[dict[str, Any]] = [{}, {}]
    for key, dist in space.items():
        low, high = (dist.choices[0], dist.choices[-1]) if isinstance(dist, CategoricalDistribution) else \
            (dist.low, dist.high)
        ends[0][key], ends[1][key] = low, high
    return ends


@contextmanager
def hold_study_dir(sweep_dir: Path) -> Iterator[None]:
    """One study command at a time in a sweep dir: a second one would tell FAIL the first one's running trials."""
    with open(sweep_dir / "study.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SweepError(f"{sweep_dir} is in use by another hydra/sweeper=optuna command; nothing was added to "
                             f"its study: wait for it to end (the same command then continues the study), or give "
                             f"another hydra.sweep.dir") from None
        yield


@contextmanager
def stop_between_trials() -> Iterator[None]:
    """SIGTERM or Ctrl-C between trials (a trial's run handles them itself while it runs) stops the sweep as a
    signal before training stops a run: one line, exit status 128 + the signal; settle_stopped records the trials
    that did not run."""
    from eagle3.errors import StoppedBeforeTraining
    from eagle3.signal_scope import raising_on

    def stopped(signum: int) -> StoppedBeforeTraining:
        log.warning("%s between trials: the sweep stops here; the same command continues the study",
                    signal.Signals(signum).name)
        return StoppedBeforeTraining(signum)

    with raising_on((signal.SIGTERM, signal.SIGINT), stopped):
        yield


def index_jobs(sweep_dir: Path) -> dict[int, IndexEntry]:
    """The sweep index's entries (eagle3.run.job_outcome writes them) by job number = trial number."""
    return SweepIndex(sweep_dir).by_num()


def settle_stopped(study, pending: list[tuple[Any, list[str]]], sweep_dir: Path) -> None:
    """The trials of a sweep stopped by a signal that were asked and not told: one whose run saved
    checkpoints/last ('stopped' in the index) stays RUNNING until its resume tells the study
    (eagle3.sweep.study.tell_resumed_trial); the others are told FAIL, and one that never started gets its
    'interrupted' index entry."""
    import optuna

    from eagle3.run.job_outcome import write_index_entry

    jobs = index_jobs(sweep_dir)
    for trial, overrides in pending:
        job = jobs.get(trial.number)
        if job is not None and job.status == "stopped":
            continue
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        if job is None:
            write_index_entry(sweep_dir, IndexEntry(num=trial.number, name=",".join(sorted(overrides)), run_dir=None,
                                                    overrides=overrides, status="interrupted"), "interrupted", None,
                              "the sweep was stopped by a signal before this trial started")


def _params_text(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items())
