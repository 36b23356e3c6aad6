"""tests/device/test_gpu.py's plumbing on CPU: its run config, the one-rank process group handed to the real run_rank
as a distributed world, the spies on the rank and the reload of a checkpoint by speculators, with the same
helpers and device=cpu (gloo, the eager loss, no autocast), so that a change that breaks them fails here and not
on the first GPU run. What only CUDA has (the fused loss, bf16 autocast, page-locked copies, nccl) stays in
tests/device/test_gpu.py, marked gpu."""

from __future__ import annotations

import pytest
import torch
from test_gpu import gpu_run_config, train_on_gpu, val_loss_of

CPU = torch.device("cpu")


@pytest.mark.slow  # trains 8 steps, twice
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_one_rank_group_trains_saves_and_speculators_loads_on_cpu(strategy, cache_dir, tmp_path, monkeypatch):
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    from eagle3.init.checkpoint import load_trainer_state

    run_dir = tmp_path / strategy
    cfg = gpu_run_config(run_dir, cache_dir, [f"distributed={strategy}", "distributed.nproc_per_node=1",
                                              "device=cpu"])
    summary, spy, _, data_dir = train_on_gpu(cfg, monkeypatch, one_rank_group=True)
    assert summary["device"] == "cpu" and summary["steps"] == 8 and summary["world_size"] == 1
    assert summary["final"]["loss"] < summary["step0"]["loss"]
    assert spy.loss_impls[0] == "eager"
    assert isinstance(spy.models[-1], DistributedDataParallel if strategy == "ddp" else FSDPModule)
    assert spy.batches and all(b["device"] == CPU and b["dtype"] == torch.float32 and b["length"] == 512
                               for b in spy.batches)
    metrics = val_loss_of(run_dir / "checkpoints" / "last", cfg, data_dir, device=CPU)
    assert metrics["loss"] == pytest.approx(summary["final"]["loss"], rel=1e-3)
    state = load_trainer_state(run_dir / "checkpoints" / "last")
    assert state["progress"]["step"] == 8 and state["optimizer"]["state"]
