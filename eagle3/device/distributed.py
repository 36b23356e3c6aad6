"""Process-group plumbing for one rank: init from torchrun's environment, wrap the model (DDP or FSDP2),
reduce metrics, and move full state dicts in and out of a wrapped model.

A single-process run never creates a process group; every helper here is then a no-op or a plain call.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from eagle3.device.choice import compute_dtype_on


@dataclass(frozen=True)
class World:
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    strategy: str = "single"        # single | ddp | fsdp

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1


def init_world(strategy: str, backend: str, device_type: str) -> World:
    """Joins the process group that the elastic launcher set up through RANK, WORLD_SIZE and MASTER_*; `backend`
    as eagle3.device.choice resolved it (nccl | gloo)."""
    if "RANK" not in os.environ:
        return World()
    world = World(int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]), strategy)
    if device_type == "cuda":
        torch.cuda.set_device(world.local_rank)
    dist.init_process_group(backend=backend)
    return world


def close_world(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def wrap_model(model: torch.nn.Module, world: World, device: torch.device) -> torch.nn.Module:
    """DDP, or FSDP2 with one shard group per decoder layer plus the root (as speculators shards it)."""
    if not world.distributed:
        return model
    if world.strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # bf16 compute on GPU as speculators does; CPU keeps fp32 (no bf16 autocast there).
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, compute_dtype_on(device.type)),
                                      reduce_dtype=torch.float32)
        # The mesh on the rank's own device type: fully_shard's default is CUDA's whenever a GPU is visible.
        mesh = init_device_mesh(device.type, (world.size,))
        for layer in model.layers:
            fully_shard(layer, mesh=mesh, mp_policy=policy)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        return model
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def grad_sync(model: torch.nn.Module, world: World, sync: bool):
    """Skips the gradient all-reduce on all but the last micro-batch of an accumulated step."""
    if not world.distributed or sync:
        return contextlib.nullcontext()
    if world.strategy == "fsdp":
        model.set_requires_gradient_sync(False)

        @contextlib.contextmanager
        def resync():
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)
        return resync()
    return model.no_sync()


def reduce_sums(sums: dict[str, Any], world: World) -> dict[str, float]:
    """Sums each value (a number or a 0-d tensor) over all ranks, with one collective and one device sync.
    Every rank must hold the same keys."""
    if not sums:
        return {}
    keys = sorted(sums)
    device = next((v.device for v in sums.values() if isinstance(v, torch.Tensor)), torch.device("cpu"))
    values = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64, device=device).reshape(()) for k in keys])
    if world.distributed:
        dist.all_reduce(values)
    return dict(zip(keys, values.tolist()))


def barrier(world: World) -> None:
    if world.distributed:
        dist.barrier()


def full_model_state(model: torch.nn.Module, world: World) -> dict[str, torch.Tensor]:
    """The unsharded state dict on CPU (a collective under FSDP: call it on every rank)."""
    if world.strategy == "fsdp" and world.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in unwrap(model).state_dict().items()}


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, world: World) -> dict[str, Any]:
    if world.strategy == "fsdp" and world.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        return get_optimizer_state_dict(model, optimizer,
                                        options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return optimizer.state_dict()


def load_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         world: World) -> None:
    if world.strategy == "fsdp" and world.distributed:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
        return
    optimizer.load_state_dict(state)
