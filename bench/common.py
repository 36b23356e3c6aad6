"""Shared by the benchmarks: the tiny default run's config, inputs and draft, built as the launcher builds them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagle3.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tiny_run_config(overrides: list[str] | None = None) -> RunConfig:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from eagle3.config import register_configs, run_config

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["logger.mode=disabled", *(overrides or [])])
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(resolved, dict)
    resolved["run"] = {"dir": "", "name": "bench", "group": "bench", "choices": {}, "overrides": []}
    return run_config(resolved)
