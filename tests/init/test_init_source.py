"""A new run's init.path that is not a checkpoint dir is refused before the data is built or a run dir is written,
by launch.py and by the sweeper's check of every job; plan=true, which reads no weights, still plans."""

from __future__ import annotations

import pytest

from commands import launch

MESSAGE = "init.path: {} does not exist; expected a draft checkpoint dir with config.json"


@pytest.fixture
def empty_cache(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    return cache


def test_a_missing_init_path_is_refused_before_anything_is_built(empty_cache, tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    r = launch([f"hydra.run.dir={tmp_path / 'run'}", "init=pretrained", f"init.path={missing}", "optim.lr=1e-5",
                "logger.mode=disabled"], empty_cache)
    assert r.returncode == 1 and MESSAGE.format(missing) in r.stderr
    assert list(empty_cache.iterdir()) == []  # no verifier and no data were built for a run that could not start
    assert not (tmp_path / "run" / "resolved_config.yaml").exists()


@pytest.mark.slow
def test_a_sweep_with_a_missing_init_path_starts_no_job(empty_cache, tmp_path):
    checkpoint = tmp_path / "not_a_checkpoint"
    checkpoint.mkdir()
    r = launch(["-m", f"hydra.sweep.dir={tmp_path / 'sweep'}", "init=pretrained",
                f"init.path={tmp_path / 'gone'},{checkpoint}", "optim.lr=1e-5", "logger.mode=disabled"], empty_cache)
    assert r.returncode == 1 and "2 of 2 sweep jobs have an invalid config; no job was started" in r.stderr
    assert MESSAGE.format(tmp_path / "gone") in r.stderr and f"{checkpoint} has no config.json" in r.stderr
    assert list(empty_cache.iterdir()) == []


@pytest.mark.slow
def test_plan_needs_no_checkpoint(empty_cache, tmp_path):
    r = launch(["plan=true", "init=pretrained", f"init.path={tmp_path / 'not_yet_downloaded'}", "optim.lr=1e-5"],
               empty_cache)
    assert r.returncode == 0, r.stderr[-2000:]
