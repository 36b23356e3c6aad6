"""How the ranks of a multi-rank run start (eagle3/run/elastic.py): forked from a forkserver that imported what a rank
needs once, each rank with the launcher's environment of its own launch."""

from __future__ import annotations

import multiprocessing
import os
from multiprocessing import forkserver
from pathlib import Path

import pytest

from eagle3.run import elastic
from eagle3.rundir.rank_errors import RankFailed
from factories import typed_run_config


def server_pid() -> int | None:
    return forkserver._forkserver._forkserver_pid


def in_a_forked_rank(expression: str):
    """The value of `expression` evaluated in a process forked from this process's forkserver, as a rank is."""
    with multiprocessing.get_context("forkserver").Pool(1) as pool:
        return pool.apply(eval, (expression,))


def two_ranks(cache_dir: Path, run_dir: Path):
    run_dir.mkdir(parents=True)
    return typed_run_config(cache_dir, run_dir, ["distributed=ddp", "distributed.nproc_per_node=2",
                                                 "distributed.backend=gloo", "optim.max_steps=1"])


@pytest.fixture
def bare_forkserver(monkeypatch):
    """ensure_forkserver() starting servers that import nothing (cheap), stopped afterwards: the next launch
    starts one with RANK_MODULES."""
    monkeypatch.setattr(elastic, "RANK_MODULES", [])
    elastic.stop_forkserver()
    yield
    elastic.stop_forkserver()


def test_the_forkserver_is_started_afresh_when_what_it_imported_with_changed(bare_forkserver, monkeypatch, tmp_path):
    elastic.ensure_forkserver()
    first = server_pid()
    monkeypatch.setenv("WANDB_MODE", "offline" if os.environ.get("WANDB_MODE") != "offline" else "disabled")
    elastic.ensure_forkserver()
    assert server_pid() == first  # read when used: the ranks get it from the launcher

    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    elastic.ensure_forkserver()  # huggingface_hub's constant, read when imported
    second = server_pid()
    assert second not in (None, first)

    saved = os.dup(1)
    try:
        with open(tmp_path / "console", "w") as console:
            os.dup2(console.fileno(), 1)  # the ranks print to the server's stdout
            elastic.ensure_forkserver()
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert server_pid() not in (None, first, second)


@pytest.mark.slow
def test_each_launchs_ranks_have_the_launchers_environment_of_that_launch(cache_dir, tmp_path, monkeypatch):
    """Two launches whose ranks one forkserver forks: the server started with GLOO_SOCKET_IFNAME set (the first
    launch's), the second launch has it unset. gloo reads it when a rank joins its process group."""
    from eagle3.run.inputs import materialize_inputs

    elastic.stop_forkserver()  # the first launch starts one
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eagle3-no-such-nic")
    cfg = two_ranks(cache_dir, tmp_path / "first")
    verifier_dir, data_dir = materialize_inputs(cfg)
    with pytest.raises(RankFailed, match="eagle3-no-such-nic"):
        elastic.run_job(cfg, verifier_dir, data_dir)
    server = server_pid()

    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    summary = elastic.run_job(two_ranks(cache_dir, tmp_path / "second"), verifier_dir, data_dir)
    assert summary is not None and summary.world_size == 2
    assert server is not None and server_pid() == server  # both launches' ranks were forked from it


@pytest.mark.slow
def test_the_forkserver_holds_what_a_rank_imports():
    elastic.ensure_forkserver()
    loaded = set(in_a_forked_rank("sorted(__import__('sys').modules)"))
    assert {"torch", "transformers", "speculators.models.eagle3", "speculators.train.distributed_batch_sampler",
            "eagle3.train.rank", "eagle3.data.loader", "eagle3.data.online"} <= loaded


@pytest.mark.gpu
def test_a_rank_forked_from_the_forkserver_can_use_cuda():
    """speculators asks torch.cuda.is_available() when the server imports it: that must not initialize CUDA there,
    or no forked rank can ("Cannot re-initialize CUDA in forked subprocess")."""
    elastic.ensure_forkserver()
    assert in_a_forked_rank("__import__('torch').cuda.init() or __import__('torch').cuda.device_count()") > 0
