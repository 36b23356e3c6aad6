"""Faults with several ranks, and sweeps: the first failing rank's own error, SIGTERM exiting as one process does,
resume clearing a failure and updating the sweep index, every sweep job checked before the first starts."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from commands import launch, run_in_process
from eagle3.errors import DataError, UserError
from eagle3.rundir.rank_errors import RankError, RankFailed, first_rank_error, write_rank_error
from factories import ROOT, SMALL_DATA, compose_cfg

QUICK = ["logger.mode=disabled", "logger.log_every=1", *SMALL_DATA]


def two_rank_config(cache_dir: Path, run_dir: Path):
    from eagle3.config import run_config

    os.environ["EAGLE3_CACHE"] = str(cache_dir)
    plain = OmegaConf.to_container(compose_cfg(["distributed=ddp", "distributed.nproc_per_node=2",
                                                "distributed.backend=gloo", "optim.max_steps=4", *QUICK]),
                                   resolve=True, enum_to_str=True)
    plain["run"] = {"dir": str(run_dir), "name": "t", "group": "t", "choices": {}, "overrides": []}
    run_dir.mkdir(parents=True)
    return run_config(plain)


def rows_only_rank_1_validates(data_dir: Path, total_seq_len: int, train_ratio: float) -> list[int]:
    from eagle3.data.loader import ValShardSampler
    from eagle3.formats.arrow_rows import ArrowRows

    seq_len = ArrowRows(data_dir).seq_len
    split = int(len(seq_len) * train_ratio)
    lengths = seq_len[split:].tolist()
    packs = [{p for pack in ValShardSampler(lengths, total_seq_len, 2, rank).packs for p in pack} for rank in (0, 1)]
    return sorted(split + p for p in packs[1] - packs[0])


@pytest.mark.slow
def test_a_data_error_in_one_rank_is_reported_as_that_ranks_own(cache_dir, tmp_path):
    """A hidden-state file only rank 1 reads, truncated after the start-up check (run_job is what runs after it)."""
    from eagle3.run.elastic import run_job
    from eagle3.run.inputs import materialize_inputs

    run_dir = tmp_path / "run"
    cfg = two_rank_config(cache_dir, run_dir)
    verifier_dir, cached_data = materialize_inputs(cfg)
    data_dir = tmp_path / "data"
    shutil.copytree(cached_data, data_dir)
    victims = rows_only_rank_1_validates(data_dir, cfg.data.total_seq_len, cfg.data.train_ratio)
    assert victims
    (data_dir / "hidden_states" / f"hs_{victims[0]}.safetensors").write_bytes(b"\x00\x01")

    with pytest.raises(DataError, match=r"^rank 1: .*hs_") as raised:
        run_job(cfg, verifier_dir, data_dir)
    assert "ChildFailedError" not in str(raised.value)
    assert "DataError" in (run_dir / "rank_1.log").read_text()
    first = first_rank_error(run_dir)
    assert first is not None and first.rank == 1 and first.user


def test_a_bug_in_a_rank_becomes_one_line_with_its_traceback_kept(tmp_path):
    try:
        {}["missing"]
    except KeyError as e:
        write_rank_error(tmp_path, 3, e)
    later = RankError(rank=0, type="RuntimeError", message="peer gone", traceback="", time=time.time() + 5,
                      user=False)
    (tmp_path / "rank_errors" / "rank_0.json").write_text(json.dumps(later.__dict__))
    first = first_rank_error(tmp_path)
    assert first is not None and first.rank == 3
    error = first.as_exception(tmp_path)
    assert isinstance(error, RankFailed) and not isinstance(error, UserError)
    assert str(error).startswith("rank 3 failed: KeyError") and "rank_3.log" in str(error)
    assert 'File "' in error.rank_traceback and "KeyError" in error.rank_traceback
    assert first_rank_error(tmp_path, since=time.time() + 60) is None  # records of an earlier launch are ignored


@pytest.mark.slow
def test_nccl_without_cuda_is_one_message_not_the_elastic_wall(cache_dir, tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = launch([f"hydra.run.dir={tmp_path / 'run'}", "distributed=ddp", "distributed.backend=nccl",
                   "optim.max_steps=1"], cache_dir)
    assert proc.returncode != 0
    assert proc.stderr.count("Traceback") == 0 and "ChildFailedError" not in proc.stderr, proc.stderr[-3000:]
    assert "distributed.backend=nccl" in proc.stderr


def wait_for_train_rows(run_dir: Path, proc: subprocess.Popen, timeout: float = 400) -> None:
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + timeout
    while time.time() < deadline and proc.poll() is None:
        if metrics.exists() and '"train"' in metrics.read_text():
            return
        time.sleep(0.1)
    raise AssertionError("no train row before the deadline")


def descendants(pid: int) -> set[int]:
    """The processes below `pid` (its children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def wait_until_gone(pids: set[int], timeout: float = 60) -> set[int]:
    """Those of `pids` still running (not a zombie) after `timeout` seconds, or none as soon as all are gone."""
    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.time() + timeout
    while (left := {p for p in pids if running(p)}) and time.time() < deadline:
        time.sleep(0.2)
    return left


@pytest.mark.slow
def test_sigterm_with_two_ranks_exits_like_one_process_and_resume_clears_it(cache_dir, tmp_path):
    sweep = tmp_path / "sweep"
    args = ["-m", "distributed=ddp", "distributed.nproc_per_node=2", "optim.epochs=2", f"hydra.sweep.dir={sweep}",
            *QUICK]
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, text=True,
                            env={**os.environ, "EAGLE3_CACHE": str(cache_dir), "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    run_dir = next(iter(sweep.glob("0_*")), None) if sweep.exists() else None
    deadline = time.time() + 300
    while run_dir is None and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
        run_dir = next(iter(sweep.glob("0_*")), None) if sweep.exists() else None
    assert run_dir is not None, proc.communicate()[0][-3000:]
    wait_for_train_rows(run_dir, proc)
    below = descendants(proc.pid)  # the forkserver and the ranks it forked, among others
    assert len(below) >= 3, below
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, out[-3000:]
    assert not wait_until_gone(below), "processes the launcher started outlived it"
    assert "Traceback" not in out and "SignalException" not in out, out[-3000:]
    assert "resume=" in out
    assert not (run_dir / "failure.json").exists()
    (job,) = json.loads((sweep / "index.json").read_text())["jobs"]
    assert job["status"] == "stopped" and "resume=" in job["resume"]

    # The printed line as a POSIX shell splits it; its launcher in this process (the ranks are processes).
    resumed = run_in_process(shlex.split(job["resume"]), cache_dir, OMP_NUM_THREADS="1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (run_dir / "failure.json").exists()
    (job,) = json.loads((sweep / "index.json").read_text())["jobs"]
    assert job["status"] == "completed" and job["steps"] == json.loads((run_dir / "summary.json").read_text())["steps"]


@pytest.mark.slow
def test_a_resumed_run_that_completes_clears_its_failure_record(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    first = launch([f"hydra.run.dir={run_dir}", "optim.max_steps=2", *QUICK], cache_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    (run_dir / "failure.json").write_text(json.dumps({"error": "RunStopped: from an earlier attempt"}))
    resumed = launch([f"resume={run_dir}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert not (run_dir / "failure.json").exists()


@pytest.mark.slow
def test_a_sweep_with_a_bad_value_starts_no_job(cache_dir, tmp_path):
    sweep = tmp_path / "sweep"
    proc = launch(["-m", "optim.lr=1e-3,-1", "model.draft.aux_layer_ids=[1,2,3],[1,1,3]", f"hydra.sweep.dir={sweep}",
                   *QUICK], cache_dir, timeout=180)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "3 of 4 sweep jobs have an invalid config" in proc.stderr
    assert "job 2 (optim.lr=-1 model.draft.aux_layer_ids=[1,2,3]" in proc.stderr
    assert not sweep.exists()


@pytest.mark.slow
def test_a_skipped_step_is_said_on_the_console(cache_dir, tmp_path, caplog):
    from test_reliability import train_poisoned

    with caplog.at_level("WARNING", logger="eagle3.train.loop"):
        progress = train_poisoned(cache_dir, tmp_path / "run", {3, 5}, ["optim.max_steps=6"])
    assert progress.skipped_steps == 2
    said = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(said) == 2, said
    assert said[0].startswith("step 3 skipped") and "1 skipped so far" in said[0]
    assert said[1].startswith("step 5 skipped") and "2 skipped so far" in said[1]
