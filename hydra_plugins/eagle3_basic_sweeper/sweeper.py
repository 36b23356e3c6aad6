"""Hydra's basic sweeper (the cartesian product of the sweep's values), made to fail early and say it once:

- before any job starts, each job's config is composed and put through the run's typed checks
  (eagle3.config.validate and the launcher's device checks), so a bad value in the last job is not found hours
  into the sweep; all bad jobs are listed in one message;
- a job that fails is logged as it fails (by eagle3.run.launch) and the sweep goes on; at the end one line says
  which jobs failed, and the exit status is non-zero, instead of the first failure's traceback.

Registered as `hydra/sweeper=eagle3_basic`, the default in conf/train.yaml. Imports nothing heavy.
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

log = logging.getLogger(__name__)


@dataclass
class Eagle3BasicSweeperConf:
    _target_: str = "hydra_plugins.eagle3_basic_sweeper.sweeper.Eagle3BasicSweeper"
    # Optional, not `X | None`, and no `from __future__ import annotations`: Hydra executes plugin modules
    # unregistered in sys.modules, where dataclasses cannot resolve string annotations.
    max_batch_size: Optional[int] = None      # noqa: UP045  jobs handed to the launcher at once (None: all)
    # Sweep values from the config, as the basic sweeper's; {} rather than None: OmegaConf cannot merge a
    # command-line `+hydra.sweeper.params={...}` into a None node.
    params: dict[str, str] = field(default_factory=dict)


ConfigStore.instance().store(group="hydra/sweeper", name="eagle3_basic", node=Eagle3BasicSweeperConf,
                             provider="eagle3")


def job_config_problem(job_cfg: DictConfig) -> Optional[str]:  # noqa: UP045
    """What the run's own checks say about one job's composed config (with its hydra node), or None."""
    from eagle3.config import validate
    from eagle3.errors import UserError
    from eagle3.run.plan_guard import check_new_job

    HydraConfig.instance().set_config(job_cfg)  # for ${hydra:...} interpolations
    task_cfg = job_cfg.copy()
    with open_dict(task_cfg):
        del task_cfg["hydra"]
    try:
        plain = OmegaConf.to_container(task_cfg, resolve=True, throw_on_missing=True, enum_to_str=True)
        assert isinstance(plain, dict)
        # plan=true reads no data (as one plan=true run): its data.path need only be a directory.
        check_new_job(validate({str(k): v for k, v in plain.items()}, dataset_required=not plain.get("plan")))
    except MissingMandatoryValue as e:
        return f"{e.full_key} is required and has no value"
    except (UserError, OmegaConfBaseException) as e:
        return str(e).splitlines()[0] if isinstance(e, OmegaConfBaseException) else str(e)
    return None


def composition_problem(e: BaseException) -> str:
    """Hydra's composition error in one line that says what the key allows: with its cause's first line
    ("Error merging override model.draft.loss=kll: Invalid value 'kll', expected one of [kl_div, ...]"), the line
    after a heading, with its key ("In 'experiment/mine': ... composing config: Invalid value ... (key ...)"),
    and the options of a group ("Could not find 'data/nonsense' (options: offline, online, tiny)")."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    problem = lines[0] if lines else type(e).__name__
    if problem.endswith(":") and len(lines) > 1:
        problem = f"{problem} {lines[1]}"
        key = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("full_key:")), "")
        problem += f" (key {key})" if key else ""
    heading = next((i for i, line in enumerate(lines) if line.startswith("Available options in")), None)
    if heading is not None:
        options = [line for line in lines[heading + 1:] if not line.startswith("Config search path")]
        options = options[:next((i for i, o in enumerate(options) if o.startswith("provider=")), len(options))]
        problem += f" (options: {', '.join(o for o in options if not o.startswith('base_'))})"
    cause = str(e.__cause__).splitlines()[0] if e.__cause__ is not None and str(e.__cause__) else ""
    return f"{problem.rstrip('.')}: {cause}" if cause and cause not in problem else problem


class Eagle3BasicSweeper(BasicSweeper):
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None and self.hydra_context is not None
        params = self._parse_config()
        params.extend(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        batches = self.split_arguments(parser.parse_overrides(params), self.max_batch_size)
        self.check_jobs([job for batch in batches for job in batch])

        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns, failed, job_idx = [], [], 0
        for batch in batches:
            results = self.launcher.launch(batch, initial_job_idx=job_idx)
            for num, result in enumerate(results, start=job_idx):
                if result.status == JobStatus.FAILED:
                    failed.append(f"job {num} ({' '.join(result.overrides or []) or 'no overrides'})")
            job_idx += len(batch)
            returns.append(results)
        if failed:
            raise SystemExit(f"error: {len(failed)} of {job_idx} sweep jobs failed: {'; '.join(failed)}. Each failed "
                             f"run dir holds failure.json; {sweep_dir / 'index.json'} lists every job")
        return returns

    def check_jobs(self, jobs: list[list[str]]) -> None:
        """Composes and checks every job's config; refuses the whole sweep, naming each bad job, before any runs."""
        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        saved = HydraConfig.instance().cfg
        problems = []
        try:
            for num, overrides in enumerate(jobs):
                try:
                    job_cfg = loader.load_sweep_config(self.config, list(overrides))
                except Exception as e:  # a composition error: Hydra's own message
                    problem: Optional[str] = composition_problem(e)  # noqa: UP045
                else:
                    problem = job_config_problem(job_cfg)
                if problem:
                    problems.append(f"  job {num} ({' '.join(overrides) or 'no overrides'}): {problem}")
        finally:
            if saved is not None:
                HydraConfig.instance().set_config(saved)
        if problems:
            raise SystemExit(f"error: {len(problems)} of {len(jobs)} sweep jobs have an invalid config; no job "
                             f"was started:\n" + "\n".join(problems))
        log.info("checked the configs of all %d sweep jobs", len(jobs))
