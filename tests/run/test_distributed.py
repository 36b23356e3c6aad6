"""Ranks started by the one launcher (DDP, FSDP2, multi-node), sweeps, and resume after a kill. All on CPU/gloo."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from commands import launch
from factories import ROOT, SMALL_DATA, compose_cfg, read_rows

SHORT = ["logger.mode=disabled", "logger.log_every=1", *SMALL_DATA]
QUICK = [*SHORT, "optim.max_steps=12"]  # 2 epochs of SMALL_DATA: 3 val passes
CONTRACT = ["resolved_config.yaml", "metrics.jsonl", "summary.json", "checkpoints/last/model.safetensors",
            "checkpoints/best/model.safetensors"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_contract(run_dir: Path) -> None:
    for name in CONTRACT:
        assert (run_dir / name).is_file(), f"{run_dir}: {name}"


def losses(run_dir: Path, split: str) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in read_rows(run_dir) if r["split"] == split]


@pytest.fixture(scope="module")
def single_accum2(cache_dir, tmp_path_factory) -> Path:
    """One process with grad_accum=2: the same global batch as 2 ranks with grad_accum=1."""
    run_dir = tmp_path_factory.mktemp("dist") / "single"
    proc = launch([f"hydra.run.dir={run_dir}", "optim.grad_accum=2", *QUICK], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.mark.slow
def test_ddp_two_ranks_match_one_process_with_the_same_global_batch(single_accum2, cache_dir, tmp_path):
    run_dir = tmp_path / "ddp"
    proc = launch([f"hydra.run.dir={run_dir}", "distributed=ddp", "distributed.nproc_per_node=2", *QUICK], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_contract(run_dir)
    assert (run_dir / "rank_1.log").is_file() and not (run_dir / "rank_0.log").exists()
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    for split in ["train", "val"]:
        ddp, single = losses(run_dir, split), losses(single_accum2, split)
        assert [s for s, _ in ddp] == [s for s, _ in single] and len(ddp) >= 3
        for (step, a), (_, b) in zip(ddp, single):
            assert a == pytest.approx(b, rel=1e-4), f"{split} step {step}"


@pytest.mark.slow
def test_fsdp_trains_and_saves_a_checkpoint_speculators_loads(cache_dir, tmp_path):
    from eagle3.init.checkpoint import load_draft

    run_dir = tmp_path / "fsdp"
    proc = launch([f"hydra.run.dir={run_dir}", "distributed=fsdp", "distributed.nproc_per_node=2", *QUICK], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_contract(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["final"]["loss"] < summary["step0"]["loss"]
    model = load_draft(run_dir / "checkpoints" / "last", attn_impl="sdpa")
    assert sum(p.numel() for p in model.parameters() if p.requires_grad) > 0


@pytest.mark.slow
def test_two_launch_processes_form_one_multinode_job(cache_dir, tmp_path):
    run_dir = tmp_path / "multinode"
    args = [f"hydra.run.dir={run_dir}", "distributed=multinode", "distributed.nnodes=2",
            "distributed.nproc_per_node=1", f"distributed.rdzv_endpoint=127.0.0.1:{free_port()}",
            "optim.max_steps=2", *SHORT]
    env = {"EAGLE3_CACHE": str(cache_dir)}
    node1 = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *args, "distributed.node_rank=1"], cwd=ROOT,
                             env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True)
    node0 = launch([*args, "distributed.node_rank=0"], cache_dir)  # this process is node 0's launcher
    out1, _ = node1.communicate(timeout=300)
    assert node0.returncode == 0, node0.stderr[-3000:]
    assert node1.returncode == 0, out1[-3000:]
    assert_contract(run_dir)
    assert json.loads((run_dir / "summary.json").read_text())["world_size"] == 2
    assert (run_dir / "rank_1.log").is_file()


def test_multirun_sweep_leaves_a_run_dir_per_job_and_an_index(sweep_2x2):
    jobs = json.loads((sweep_2x2 / "index.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["completed"] * 4
    for job in jobs:
        run_dir = Path(job["run_dir"])
        assert_contract(run_dir)
        assert "optim.lr=" in run_dir.name and "optim.epochs=" in run_dir.name  # readable names
        assert job["best_tau_sim"] >= 1.0
    steps = {json.loads((Path(j["run_dir"]) / "summary.json").read_text())["steps"] for j in jobs}
    assert steps == {6}


@pytest.mark.slow
def test_a_failing_job_is_recorded_and_the_sweep_goes_on(cache_dir, tmp_path):
    sweep = tmp_path / "sweep"
    # hidden_size 96 passes the config checks (a bad value there would start no job), and the data's record
    # refuses it when the job runs.
    proc = launch(["-m", "model.draft.hidden_size=96,128", f"hydra.sweep.dir={sweep}", "logger.mode=disabled",
                   "optim.max_steps=2", *SMALL_DATA], cache_dir)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]  # one summary after running all jobs
    jobs = json.loads((sweep / "index.json").read_text())["jobs"]
    assert [j["status"] for j in jobs] == ["failed", "completed"]
    assert "model.draft.hidden_size" in jobs[0]["error"]
    assert "model.draft.hidden_size" in json.loads((Path(jobs[0]["run_dir"]) / "failure.json").read_text())["error"]
    assert_contract(Path(jobs[1]["run_dir"]))
    # said when it fails, with its run dir; summed up at the end
    assert "job 0 (model.draft.hidden_size=96 " in out and "failed: model.draft.hidden_size=96 but" in out
    assert jobs[0]["run_dir"] in out
    assert "error: 1 of 2 sweep jobs failed: job 0 (model.draft.hidden_size=96" in proc.stderr


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(cache_dir, tmp_path, trained_run):
    """The run killed mid-way and resumed ends as `trained_run` (conftest.py: the same run uninterrupted, its
    checkpoints at the end only) did."""
    args = ["optim.epochs=2", "optim.checkpoint_every=5", "logger.mode=offline", *SMALL_DATA]
    reference = trained_run

    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), f"hydra.run.dir={killed}", *args], cwd=ROOT,
                            env={**os.environ, "EAGLE3_CACHE": str(cache_dir)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    state = killed / "checkpoints" / "last" / "trainer_state.pt"
    deadline = time.time() + 240
    while not state.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert state.exists(), "no checkpoint before the deadline"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()  # it really died mid-run

    resumed = launch([f"resume={killed}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ref, res = (json.loads((d / "summary.json").read_text()) for d in (reference, killed))
    assert res["steps"] == ref["steps"]
    assert res["final"]["loss"] == pytest.approx(ref["final"]["loss"], rel=0.01)
    steps = [r["step"] for r in read_rows(killed)]
    assert steps == sorted(steps) and steps.count(0) == 1  # no duplicated rows from the killed run
    ids = {p.name.rsplit("-", 1)[1] for p in (killed / "wandb").glob("offline-run-*")}
    assert len(ids) == 1  # the resumed run continues the same wandb run


def test_resume_refuses_other_overrides_and_non_runs(cache_dir, tmp_path):
    proc = launch([f"resume={tmp_path}", "optim.lr=1e-4"], cache_dir, timeout=60)
    assert proc.returncode != 0 and "optim.lr=1e-4" in proc.stderr and "Traceback" not in proc.stderr
    proc = launch([f"resume={tmp_path}"], cache_dir, timeout=60)
    assert proc.returncode != 0 and "not a run dir" in proc.stderr


def test_slurm_launcher_config_composes():
    cfg = compose_cfg(["hydra/launcher=slurm"], return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.tasks_per_node == 1 and launcher.timeout_min == 1440
