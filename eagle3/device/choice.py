"""What a run's `auto` choices come to on this machine: the device type, the process group's backend, the draft's
attention implementation and the compute dtype, resolved once into a `Runtime` and passed to who needs them.

CUDA availability is asked here and nowhere else in the training path. Imports torch only inside the function
that asks, so the config and the launcher's --help stay free of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from eagle3.config import AttnImpl, Backend, Device
from eagle3.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from eagle3.config import TrainConfig


@dataclass(frozen=True)
class Runtime:
    device_type: str       # cpu | cuda
    backend: str           # gloo | nccl
    attn_impl: str         # sdpa | eager | simple_flex_attention
    compute_dtype: str     # bfloat16 (CUDA, under autocast) | float32 (CPU: no bf16 autocast there)

    @property
    def cuda(self) -> bool:
        return self.device_type == "cuda"

    @property
    def loss_impl(self) -> str:
        return loss_impl_on(self.device_type)

    def device(self, local_rank: int = 0) -> torch.device:
        import torch

        return torch.device("cuda", local_rank) if self.cuda else torch.device("cpu")

    def dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.compute_dtype)


def compute_dtype_on(device_type: str) -> str:
    """The dtype a rank computes in: bf16 on CUDA (under autocast), float32 on CPU (no bf16 autocast there)."""
    return "bfloat16" if device_type == "cuda" else "float32"


def loss_impl_on(device_type: str) -> str:
    """speculators' loss implementation: the fused one is Triton, CUDA only."""
    return "fused" if device_type == "cuda" else "eager"


def attn_impl_on(choice: AttnImpl | str, device_type: str) -> str:
    """model.draft.attn_impl with `auto` resolved: flex attention on CUDA, sdpa on CPU (flex has no backward)."""
    choice = AttnImpl(choice)
    if choice == AttnImpl.simple_flex_attention and device_type == "cpu":
        raise ConfigError("model.draft.attn_impl: simple_flex_attention has no backward on CPU (torch's FlexAttention "
                          "trains on CUDA only), and this run trains on the CPU: use auto (sdpa here), sdpa or eager")
    if choice != AttnImpl.auto:
        return choice.value
    return AttnImpl.simple_flex_attention.value if device_type == "cuda" else AttnImpl.sdpa.value


def resolve_runtime(device: Device | str, backend: Backend | str = Backend.auto,
                    attn_impl: AttnImpl | str = AttnImpl.auto, ranks_per_node: int = 1) -> Runtime:
    """The runtime these choices give on this machine; ConfigError where they ask for a GPU it lacks."""
    device, backend = Device(device), Backend(backend)
    asks_cuda = device == Device.cuda or backend == Backend.nccl
    if device == Device.cpu and not asks_cuda:  # nothing to ask torch (not even imported)
        return Runtime("cpu", "gloo" if backend == Backend.auto else backend.value, attn_impl_on(attn_impl, "cpu"),
                       compute_dtype_on("cpu"))
    import torch

    cuda = torch.cuda.is_available()
    if asks_cuda and not cuda:
        wants = "device=cuda" if device == Device.cuda else "distributed.backend=nccl"
        raise ConfigError(f"{wants} needs a CUDA GPU, and torch sees none on this machine; use device=auto (or cpu)"
                          f"{' and distributed.backend=auto (gloo on CPU)' if backend == Backend.nccl else ''}")
    device_type = "cuda" if asks_cuda or (device == Device.auto and cuda) else "cpu"
    if asks_cuda and torch.cuda.device_count() < ranks_per_node:
        raise ConfigError(f"distributed.nproc_per_node={ranks_per_node} starts one rank per GPU, and this "
                          f"machine has {torch.cuda.device_count()}")
    chosen_backend = backend.value if backend != Backend.auto else ("nccl" if device_type == "cuda" else "gloo")
    return Runtime(device_type=device_type, backend=chosen_backend, attn_impl=attn_impl_on(attn_impl, device_type),
                   compute_dtype=compute_dtype_on(device_type))


def runtime_of(cfg: TrainConfig) -> Runtime:
    """The runtime of a run config (device, distributed.backend, model.draft.attn_impl)."""
    dist = cfg.distributed
    return resolve_runtime(cfg.device, dist.backend, cfg.model.draft.attn_impl, dist.nproc_per_node)
