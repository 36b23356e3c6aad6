"""The run's tracker (eagle3.train.track): wandb online needs an API key found without the network and a reachable
server, checked before any data is built; summary.json is whole or absent when its write fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from commands import launch
from eagle3.config import LoggerConfig, LoggerMode
from eagle3.errors import ConfigError


def test_wandb_online_needs_a_key_found_without_the_network(tmp_path, monkeypatch):
    from eagle3.train.track import check_wandb, unreachable

    monkeypatch.setenv("WANDB_API_KEY", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(ConfigError, match="logger.mode=online: no wandb API key.*wandb login.*logger.mode=offline"):
        check_wandb(LoggerConfig(mode=LoggerMode.online))
    check_wandb(LoggerConfig(mode=LoggerMode.offline))  # offline needs neither
    assert unreachable("http://127.0.0.1:1") is not None  # a closed port: refused at once


@pytest.mark.slow
def test_wandb_online_without_a_key_or_a_network_stops_before_any_data_is_built(tmp_path):
    cache = tmp_path / "cache"
    no_key = launch(["logger.mode=online", f"hydra.run.dir={tmp_path / 'run'}"], cache, timeout=300,
                    WANDB_API_KEY="", HOME=str(tmp_path), NETRC=str(tmp_path / "netrc"))
    unreachable = launch(["logger.mode=online", f"hydra.run.dir={tmp_path / 'run2'}"], cache, timeout=300,
                         WANDB_API_KEY="0" * 40, WANDB_BASE_URL="http://127.0.0.1:1", HOME=str(tmp_path))
    for proc, message in ((no_key, "no wandb API key"), (unreachable, "cannot be reached")):
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (cache / "datasets").exists()  # refused before the data build


def test_summary_json_is_whole_or_absent_when_its_write_fails(tmp_path, monkeypatch):
    import errno

    from eagle3.rundir.progress import Progress, RunSummary
    from eagle3.train.track import Tracker

    row = {"step": 4, "split": "val", "epoch": 0, "loss": 2.5, "tau_sim": 1.25}
    summary = RunSummary.of(Progress(step=4, step0=row, best=row, final=row), Path("/v"), Path("/d"), "cpu", 1)

    from eagle3 import safe_write

    real = safe_write.open_write

    class HalfThenFull:  # the disk fills up halfway through the file
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            self.file.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    with Tracker(tmp_path, LoggerConfig(mode=LoggerMode.disabled)) as tracker:
        monkeypatch.setattr(safe_write, "open_write", lambda *a, **k: HalfThenFull(real(*a, **k)))
        with pytest.raises(OSError):
            tracker.finish(summary)
    assert not (tmp_path / "summary.json").exists()
