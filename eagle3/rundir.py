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


# What a resume may change: where the run dir and the inputs' cache are, where this node is in a multi-node job,
# and how it is logged. Anything else changes the training the checkpoint is part of.
RESUME_MAY_CHANGE = ("run.", "resume", "cache_dir", "logger.", "distributed.node_rank", "distributed.rdzv_endpoint")


def trained_config(plain: dict[str, Any]) -> dict[str, Any]:
    """The part of a plain run config that a checkpoint is trained with (its `run` and `resume` are where it lies)."""
    return {k: v for k, v in plain.items() if k not in ("run", "resume")}


def config_changes(trained: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """`key: trained -> now` for each key whose value differs, besides those a resume may change."""
    before, after = flatten(trained), flatten(now)
    keys = sorted(k for k in before.keys() | after.keys()
                  if not k.startswith(RESUME_MAY_CHANGE) and before.get(k) != after.get(k))
    return [f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
