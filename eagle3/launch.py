"""What launch.py does with a composed config: resolve and validate it once, write the run dir,
materialize the verifier and data, then run the rank.

Nothing here imports torch or speculators before the config is known to be good.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from eagle3.config import ConfigError, validate

log = logging.getLogger(__name__)


def launch(cfg: DictConfig) -> float | None:
    """Runs one job; returns its best val tau_sim (the objective a sweeper would maximise)."""
    try:
        resolved = resolve(cfg)
        run_dir = Path(resolved["run"]["dir"])
        refuse_to_overwrite(run_dir)
        validate(resolved)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "resolved_config.yaml").write_text(OmegaConf.to_yaml(resolved))

    start = time.perf_counter()
    quiet_libraries()
    verifier_dir, data_dir = materialize_inputs(resolved)
    from eagle3.rank import run_rank

    summary = run_rank(resolved, verifier_dir, data_dir)
    log.info("done in %.1f s", time.perf_counter() - start)
    return summary["best"]["tau_sim"]


def resolve(cfg: DictConfig) -> dict[str, Any]:
    """The plain, fully resolved config plus what Hydra knows about this job (group choices, overrides)."""
    try:
        resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} is required and has no value: set it, e.g. `{e.full_key}=...`") from None
    hydra = HydraConfig.get()
    choices = {g: c for g, c in hydra.runtime.choices.items() if not g.startswith("hydra") and c is not None}
    run_dir = Path(hydra.runtime.output_dir)
    multirun = hydra.mode is not None and hydra.mode.name == "MULTIRUN"
    name = hydra.job.override_dirname or run_dir.name
    resolved["run"] = {
        "dir": str(run_dir.resolve()),
        "name": name,
        "group": str(Path(hydra.sweep.dir).name) if multirun else name,
        "choices": choices,
        "overrides": list(hydra.overrides.task),
    }
    return resolved


def refuse_to_overwrite(run_dir: Path) -> None:
    if (run_dir / "checkpoints").exists() or (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run (checkpoints or metrics.jsonl); "
                          "choose a new hydra.run.dir, nothing was overwritten")


def quiet_libraries() -> None:
    """Keeps the console to our progress bars and results: per-file save/load bars and notices go."""
    import warnings

    import transformers
    from loguru import logger

    transformers.utils.logging.disable_progress_bar()
    logger.disable("speculators.utils.loading")  # "Loading from local directory ..." once per tensor group
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")


def materialize_inputs(cfg: dict[str, Any]) -> tuple[Path, Path]:
    """The verifier dir and data dir this run reads, building the tiny verifier and synthetic data if asked."""
    from eagle3.data.prepare import synthetic_dataset_dir
    from eagle3.data.verifier import tiny_verifier_dir

    verifier, data = cfg["model"]["verifier"], cfg["data"]
    verifier_dir = (Path(verifier["path"]) if verifier["path"] is not None
                    else tiny_verifier_dir(verifier["tiny"], cfg["cache_dir"]))
    if data["path"] is not None:
        return verifier_dir, Path(data["path"])
    data_dir = synthetic_dataset_dir(verifier_dir, data["synth"], cfg["model"]["draft"]["aux_layer_ids"],
                                     cfg["cache_dir"], data["hidden_states_dtype"])
    return verifier_dir, data_dir
