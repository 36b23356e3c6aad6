"""Run dirs written before the data sources' registry (one data schema with `path`, `synth`, `prefetch` and an
`online: {enabled, shard_verifier}` block for every data option) still resume, evaluate and compare. The
fixtures in tests/old_run_dirs/ are resolved_config.yaml files as the launcher at 7a9ec4c wrote them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from commands import launch, sigterm_in_process_after_step_1
from eagle3.config import plain_config, run_config, validate
from eagle3.errors import ConfigError
from eagle3.rundir.files import RESOLVED_CONFIG, data_part_before_sources, read_run_config, trained_config
from factories import ROOT, SMALL_DATA, compose_cfg

OLD = ROOT / "tests" / "old_run_dirs"


def old_run_dir(tmp_path: Path, fixture: str, data_path: Path | None = None) -> Path:
    """A run dir holding the fixture's resolved_config.yaml (its data.path replaced by `data_path` when given)."""
    plain = yaml.safe_load((OLD / f"{fixture}.yaml").read_text())
    if data_path is not None:
        plain["data"]["path"] = str(data_path)
    run_dir = tmp_path / "old"
    run_dir.mkdir()
    (run_dir / RESOLVED_CONFIG).write_text(yaml.safe_dump(plain, sort_keys=False))
    return run_dir


@pytest.mark.parametrize("fixture", ["tiny", "offline", "online", "online_rows"])
def test_an_old_resolved_config_types_as_a_fresh_composition_of_its_options(fixture, tmp_path):
    data_path = tmp_path if fixture == "offline" else None
    run_dir = old_run_dir(tmp_path, fixture, data_path)
    old = read_run_config(run_dir)
    assert "online" not in old["data"]
    overrides = [o if not (data_path and o.startswith("data.path=")) else f"data.path={data_path}"
                 for o in old["run"]["overrides"]]
    fresh = OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True)
    assert trained_config(plain_config(run_config(old, dataset_required=False))) == \
        trained_config(plain_config(validate(fresh, dataset_required=False)))


def test_an_old_online_run_keeps_its_sharded_verifier(tmp_path):
    run_dir = old_run_dir(tmp_path, "online")
    plain = yaml.safe_load((run_dir / RESOLVED_CONFIG).read_text())
    plain["data"]["online"]["shard_verifier"] = True
    (run_dir / RESOLVED_CONFIG).write_text(yaml.safe_dump(plain))
    cfg = run_config(read_run_config(run_dir), dataset_required=False)
    assert cfg.data.verifier_in_rank() == "sharded"


@pytest.mark.parametrize("part, key", [("online", "data.online"), ("data", "data.shard_verifier")])
def test_an_unknown_key_of_an_old_data_part_is_refused_by_name(part, key, tmp_path):
    run_dir = old_run_dir(tmp_path, "tiny")
    plain = yaml.safe_load((run_dir / RESOLVED_CONFIG).read_text())
    if part == "online":
        plain["data"]["online"]["prefetch_depth"] = 3  # a key no layout had
    else:
        plain["data"]["online"]["shard_verifier"] = True  # data=tiny holds no verifier to shard
    (run_dir / RESOLVED_CONFIG).write_text(yaml.safe_dump(plain))
    with pytest.raises(ConfigError, match=key):
        run_config(read_run_config(run_dir), dataset_required=False)


def test_compare_shows_an_old_run_dirs_data_part_in_todays_keys(tmp_path):
    from eagle3.sweep.compare import read_run

    run = read_run(old_run_dir(tmp_path, "online"))
    assert run.config["data.shard_verifier"] is False
    assert not [k for k in run.config if k.startswith("data.online") or k == "data.prefetch"]
    assert "distributed.max_restarts" not in run.config and run.config["distributed.strategy"] == "ddp"


def test_a_deleted_key_of_an_old_run_dir_is_left_out_whatever_it_held(tmp_path):
    """distributed.max_restarts is gone from the schema: the fixtures' `max_restarts: 0` (and a value from before it
    was refused past 0) no longer types, and the run dir still reads without it."""
    run_dir = old_run_dir(tmp_path, "tiny")
    plain = yaml.safe_load((run_dir / RESOLVED_CONFIG).read_text())
    assert plain["distributed"]["max_restarts"] == 0
    with pytest.raises(ConfigError, match=r"distributed\.max_restarts: Key 'max_restarts' not in"):
        run_config(data_part_before_sources({**plain, "run": {**plain["run"], "dir": str(run_dir)}}),
                   dataset_required=False)
    plain["distributed"]["max_restarts"] = 3
    (run_dir / RESOLVED_CONFIG).write_text(yaml.safe_dump(plain))
    old = read_run_config(run_dir)
    assert "max_restarts" not in old["distributed"]
    assert run_config(old, dataset_required=False).distributed.strategy.value == plain["distributed"]["strategy"]


def written_before_sources(plain: dict) -> dict:
    """A data=tiny config as the launcher at 7a9ec4c wrote it (tests/old_run_dirs/tiny.yaml's layout)."""
    draft = {k: v for k, v in plain["model"]["draft"].items() if k not in ("kind", "mask_token_id")}
    data = {**plain["data"], "path": None, "online": {"enabled": False, "shard_verifier": False}}
    distributed = {**plain["distributed"], "max_restarts": 0}
    return {**plain, "model": {**plain["model"], "draft": draft}, "data": data, "distributed": distributed}


@pytest.mark.slow
def test_an_interrupted_old_run_resumes_and_is_measured(cache_dir, tmp_path):
    import torch

    from eagle3.cli.accept import main as accept
    from eagle3.init.checkpoint import TRAINER_STATE

    run_dir = tmp_path / "run"
    stopped = sigterm_in_process_after_step_1([f"hydra.run.dir={run_dir}", "optim.max_steps=4", *SMALL_DATA],
                                              cache_dir)
    assert stopped.returncode != 0 and (run_dir / "checkpoints" / "last" / TRAINER_STATE).is_file(), \
        stopped.stderr[-3000:]
    config_file, state_file = run_dir / RESOLVED_CONFIG, run_dir / "checkpoints" / "last" / TRAINER_STATE
    config_file.write_text(yaml.safe_dump(written_before_sources(yaml.safe_load(config_file.read_text()))))
    state = torch.load(state_file, weights_only=True)
    state["config"] = written_before_sources(state["config"])
    torch.save(state, state_file)
    proc = launch([f"resume={run_dir}"], cache_dir, WANDB_MODE="offline")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (run_dir / "summary.json").is_file()
    accept(["--run", str(run_dir), "--num-prompts", "2", "--max-new-tokens", "8"])  # measured: its size is no matter
    assert (run_dir / "accept_k3.json").is_file()
