"""What a plan is made of and from: its memory terms and the plan itself (eagle3.plan.memory computes them), and the
resolved inputs make_plan takes: the run's config parts, the machine, what the data source says, the verifiers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eagle3.config import DataConfig, DistributedConfig, DraftConfig, OptimConfig, TrainConfig

GIB = 1024 ** 3
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Dense bf16 peak of one device (NVIDIA's H100/H200 SXM datasheet, without sparsity) and the share of it a
# one-layer draft's step reaches: an assumption to be replaced by bench/gpu.py's measured MFU.
PEAK_FLOPS = {"cuda": 989e12, "cpu": 1e11}
UTILIZATION = 0.35
# The guard refuses a peak above this share of the device's memory (the allocator's fragmentation, CUDA
# context and library workspaces need the rest).
FIT_SHARE = 0.95
# The exit status of `plan=true` for a plan that does not fit (1 is a refused config), so that a script can gate.
NO_FIT_STATUS = 3


@dataclass
class Term:
    name: str
    bytes: int
    note: str = ""
    on_device: bool = True  # False: host memory (the reader's ring on a GPU run)
    # Terms of one phase of a step are alive together and freed after it; "" = alive throughout. data=online runs
    # the verifier's forward (for the next micro-batch) and the draft's step one after the other, never together,
    # so the peak counts the larger phase, not both.
    phase: str = ""


DRAFT_STEP, VERIFIER_FORWARD = "draft step", "verifier forward"
# The plan's terms for a verifier the training process loads beside the draft with offline data: eval.accept's on
# rank 0, or on-policy rollouts' in every rank (which eval.accept then reuses).
ACCEPT_VERIFIER = "verifier in the training process (rank 0)"
ROLLOUT_VERIFIER = "verifier for on-policy rollouts (every rank)"


@dataclass
class VerifierShape:
    """What the plan needs of the verifier that data=online runs in every rank (eagle3.plan.sizes.verifier_shape
    reads it from its config.json and safetensors headers): parameter counts as loaded, and the widths one token's
    forward goes through."""

    params: int          # the causal LM as loaded: embedding, decoder layers, final norm, lm_head
    embedding: int       # embed_tokens + the final norm: the decoder's own parameters (the FSDP2 root when sharded)
    lm_head: int         # 0 when tied to the embedding; a sharded verifier drops it (hidden states never need it)
    layer_params: int    # the largest decoder layer (FSDP2 all-gathers one at a time)
    active_params: int   # decoder weights one token goes through (a MoE: the shared and top-k routed experts only)
    num_layers: int
    hidden_size: int
    q_dim: int           # heads x query head dim
    kv_dim: int          # keys + values per token, all heads
    mlp_width: int       # the widest MLP intermediate per token (a MoE: shared + top-k experts)
    source: str          # where the counts came from


@dataclass
class Plan:
    device_type: str
    world_size: int
    strategy: str
    attn_impl: str
    gradient_checkpointing: bool
    terms: list[Term]
    trainable_params: int
    frozen_params: int
    tokens_per_step: int
    flops_per_step: float
    step_seconds: float
    device_memory: int | None
    device_memory_source: str
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    data_notes: list[str] = field(default_factory=list)
    # data=online: "full" (a copy per rank) or "sharded" (data.shard_verifier over the ranks); None offline.
    online_verifier: str | None = None
    verifier_bytes: int = 0                  # its weights' share of the peak on each rank (all-gathered parts too)
    verifier_if_sharded: int | None = None   # what that would be with data.shard_verifier=true (ranks > 1)
    verifier_flops_per_step: float = 0.0
    rate_note: str = ""  # what rate the step time assumes, and where it came from

    def phase_bytes(self) -> dict[str, int]:
        phases: dict[str, int] = {}
        for t in self.terms:
            if t.on_device and t.phase:
                phases[t.phase] = phases.get(t.phase, 0) + t.bytes
        return phases

    @property
    def peak(self) -> int:
        """What is alive throughout, plus the larger of the phases that run one after the other."""
        always = sum(t.bytes for t in self.terms if t.on_device and not t.phase)
        return always + max(self.phase_bytes().values(), default=0)

    @property
    def largest(self) -> Term:
        return max((t for t in self.terms if t.on_device), key=lambda t: t.bytes)

    def fits(self) -> bool:
        return self.device_memory is None or self.peak <= FIT_SHARE * self.device_memory


@dataclass
class DataStats:
    """What the plan knows about a dataset: train rows' token counts and the hidden-state bytes on disk (0 online)."""

    train_tokens: int
    train_rows: int
    total_tokens: int
    hidden_bytes_on_disk: int
    train_lengths: Sequence[int] | None = None  # each train row's tokens: the run's own count of steps (packing)


Shape = tuple  # a kernel eagle3.plan.roofline times: ("mm", m, k, n), ("sdpa", T, heads, head_dim, keys, backward),
# ("loss", T, vocab)


@dataclass
class PlannedRun:
    """The config parts a plan reads."""

    draft: DraftConfig
    data: DataConfig
    optim: OptimConfig
    dist: DistributedConfig
    train_lm_head: bool = False  # init=pretrained with init.train_lm_head: the lm_head is trained too

    @classmethod
    def of(cls, cfg: TrainConfig) -> PlannedRun:
        from eagle3.config import PretrainedInitConfig

        lm_head = isinstance(cfg.init, PretrainedInitConfig) and cfg.init.train_lm_head
        return cls(cfg.model.draft, cfg.data, cfg.optim, cfg.distributed, lm_head)


@dataclass
class Machine:
    """The device the plan is for: its kind (cuda, cpu), its memory per rank and where that figure came from, and its
    measured matrix-multiply rates (FLOP/s) at given shapes with where they came from (eagle3.plan.roofline.rates_for;
    None, or a shape without a rate: the step time assumes a share of the device's peak)."""

    device_type: str
    device_memory: int | None = None
    device_memory_source: str = "none"
    matmul_rates: Callable[[list[Shape]], tuple[dict[Shape, float], str]] | None = None


@dataclass
class SourceFacts:
    """What the run's data source says (eagle3.data.sources): its hidden-state buffers on a rank, its rows' counts
    (None: not counted, with the reason), and the run dir's disk for hidden states computed in the loop
    (data.cache_gb)."""

    terms: list[Term]
    stats: DataStats | None = None
    no_rows_reason: str = ""
    hidden_cache_bytes: int = 0


@dataclass
class Verifiers:
    """The verifiers a rank holds besides the draft: `online`, the one data=online runs in every rank (eval.accept
    and the rollouts then reuse it: counted once); `loaded`, the term of the one the training process loads with
    offline data (ACCEPT_VERIFIER or ROLLOUT_VERIFIER)."""

    online: VerifierShape | None = None
    loaded: Term | None = None
