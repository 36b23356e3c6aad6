"""Where a run dir keeps its files. A run dir works wherever it is: the paths inside it are stored relative to it
(summary.json's checkpoints) or re-derived from the dir the user names (resolved_config.yaml's `run.dir`), so a
run dir that was moved or copied resumes, evaluates and compares as itself, and never as the run that once stood
at its old path. Imports nothing heavy: the launcher's light paths go through it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from eagle3.errors import ConfigError

RESOLVED_CONFIG = "resolved_config.yaml"
SUMMARY = "summary.json"
CHECKPOINTS = "checkpoints"
CHECKPOINT_NAMES = ("last", "best")


def checkpoint_dir(run_dir: str | Path, name: str) -> Path:
    """`<run_dir>/checkpoints/<name>` (name: last or best)."""
    return Path(run_dir) / CHECKPOINTS / name


def relative_checkpoints() -> dict[str, str]:
    """summary.json's checkpoints: relative to the run dir, so that they name this run's wherever it lies."""
    return {name: f"{CHECKPOINTS}/{name}" for name in CHECKPOINT_NAMES}


def read_run_config(run_dir: Path, what: str = "resume") -> dict[str, Any]:
    """A run dir's resolved_config.yaml, plain, with `run.dir` the dir given here (where the run is now, not where
    it was made). `what` names the option that gave the dir, for the message."""
    import yaml

    config_file = run_dir / RESOLVED_CONFIG
    if not config_file.is_file():
        raise ConfigError(f"{what}: {run_dir} is not a run dir (no {RESOLVED_CONFIG})")
    try:
        plain = yaml.safe_load(config_file.read_text())
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{what}: {config_file} is not YAML ({type(e).__name__})") from None
    if not isinstance(plain, dict) or not isinstance(plain.get("run", {}), dict):
        raise ConfigError(f"{what}: {config_file} is not a resolved run config (no mapping of keys to values)")
    plain["run"] = {**plain.get("run", {}), "dir": str(run_dir)}
    return plain
