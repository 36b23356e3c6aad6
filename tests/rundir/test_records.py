"""What a run writes about itself goes only where it belongs: a refused command never rewrites the records of the
run it pointed at, and a resumed run's metrics.jsonl survives a row cut short by the kill."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commands import launch
from eagle3.config import LoggerConfig, LoggerMode
from eagle3.console import hydra_override
from eagle3.train.track import Tracker


def fake_sweep_job(tmp_path: Path) -> tuple[Path, Path, str]:
    """A sweep dir whose job 0 completed: its run dir (with a config, no checkpoint) and its index entry."""
    sweep = tmp_path / "sweep"
    job = sweep / "0_optim.lr=0.001"
    job.mkdir(parents=True)
    (job / "resolved_config.yaml").write_text("seed: 0\n")
    index = json.dumps({"sweep_dir": str(sweep), "jobs": [
        {"num": 0, "name": "optim.lr=0.001", "run_dir": str(job), "overrides": ["optim.lr=0.001"],
         "status": "completed", "error": None, "steps": 6, "best_tau_sim": 1.2, "best_step": 6,
         "final_loss": 30.0, "final_tau_sim": 1.2}]}, indent=2) + "\n"
    (sweep / "index.json").write_text(index)
    return sweep, job, index


def test_a_refused_resume_leaves_the_sweep_index_and_the_run_alone(tmp_path):
    sweep, job, index = fake_sweep_job(tmp_path)
    resume = hydra_override("resume", str(job))
    for args in ([resume, "optim.lr=1"], [resume]):  # extra overrides; no checkpoint to resume
        proc = launch(args, tmp_path / "cache")
        assert proc.returncode != 0 and "error:" in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr
        assert (sweep / "index.json").read_text() == index
        assert not (job / "failure.json").exists()


def test_resume_drops_rows_after_the_checkpoint_and_a_torn_last_line(tmp_path):
    rows = [{"step": s, "split": "train", "loss": 1.0} for s in (10, 20, 30)]
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 40, "spl')  # killed mid-write
    with Tracker(tmp_path, LoggerConfig(mode=LoggerMode.disabled), resume_step=20) as tracker:
        tracker.log({"step": 30, "split": "train", "loss": 0.5})
    assert [json.loads(line) for line in metrics.read_text().splitlines()] == [
        rows[0], rows[1], {"step": 30, "split": "train", "loss": 0.5}]


def test_two_runs_cannot_hold_one_run_dir_and_the_refused_one_is_told_the_holder(tmp_path):
    import os

    from eagle3 import safe_write
    from eagle3.errors import ConfigError
    from eagle3.rundir.files import RunDir

    RunDir(tmp_path / "run").hold("pid 1: python launch.py resume=run")
    try:
        with pytest.raises(ConfigError, match=r"in use by another run .*pid 1: python launch.py resume=run"):
            RunDir(tmp_path / "run").hold()  # a second open file of the lock, as a second process would hold
    finally:
        safe_write._held.pop(os.path.realpath(tmp_path / "run" / ".lock")).close()


def test_a_dir_holding_a_run_or_a_sweep_is_refused_before_hydra_writes_into_it(tmp_path):
    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    (run / "metrics.jsonl").write_text("")
    (run / ".hydra" / "overrides.yaml").write_text("- optim.lr=0.001\n")
    proc = launch([f"hydra.run.dir={run}", "optim.lr=5e-4"], tmp_path / "cache")
    assert proc.returncode != 0 and "already holds a run" in proc.stderr and "Traceback" not in proc.stderr
    assert (run / ".hydra" / "overrides.yaml").read_text() == "- optim.lr=0.001\n"
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "index.json").write_text('{"jobs": []}\n')
    proc = launch(["-m", f"hydra.sweep.dir={sweep}", "optim.lr=1e-3,2e-3"], tmp_path / "cache")
    assert proc.returncode != 0 and "already holds a sweep" in proc.stderr and "Traceback" not in proc.stderr
    assert (sweep / "index.json").read_text() == '{"jobs": []}\n'


def test_a_dataset_without_readable_token_counts_is_one_data_error(tmp_path):
    from eagle3.errors import DataError
    from eagle3.formats.vocab import vocab_mapping

    with pytest.raises(DataError, match="no token_freq.pt"):
        vocab_mapping(tmp_path, 8, 16)
    (tmp_path / "token_freq.pt").write_bytes(b"not a torch file")
    with pytest.raises(DataError, match="is not a token-count file: .*; it cannot be loaded as one"):
        vocab_mapping(tmp_path, 8, 16)


def test_speedup_never_overwrites_its_json(tmp_path):
    from eagle3.cli.speedup import main

    target = tmp_path / "summary.json"
    target.write_text("{}")
    with pytest.raises(SystemExit, match="exists; nothing was overwritten"):
        main(["--accept-rates", "0.5", "--baseline-ms", "1", "--verify-ms", "2", "--json", str(target)])
    assert target.read_text() == "{}"
