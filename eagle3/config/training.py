"""The schemas of how a draft is trained: its initializer's options (scratch or a pretrained checkpoint), the
optimizer, the ranks (distributed), logging, the measurements at val passes and after the run (eval), and what the
loop does besides the data's steps (on-policy rollouts)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from omegaconf import MISSING

from eagle3.config.checks import require, require_dir, require_temperature
from eagle3.config.data import ROWS_FILES, rows_path_problem


class Scheduler(str, Enum):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class LoggerMode(str, Enum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class Strategy(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"


class Backend(str, Enum):
    """The process group's backend; auto: nccl on CUDA, gloo on CPU."""

    auto = "auto"
    nccl = "nccl"
    gloo = "gloo"


class VocabPolicy(str, Enum):
    keep = "keep"
    rebuild = "rebuild"
    remap = "remap"


@dataclass
class InitConfig:
    """What every initializer's options have: `name` selects the initializer (eagle3/init), `recommended_lr`
    is the lr range it trains well in (the launcher warns outside it)."""

    name: str = MISSING
    recommended_lr: list[float] = MISSING

    def check_source(self) -> None:
        """What a new run reads from outside the run dir to initialize the draft, there before anything is built
        (a resume reads its own checkpoints, and plan=true no weights; so not in a check of the config)."""


@dataclass
class ScratchInitConfig(InitConfig):
    name: str = "scratch"
    # lr range that trains a fresh draft; the launcher warns outside it
    recommended_lr: list[float] = field(default_factory=lambda: [1e-5, 3e-3])


@dataclass
class PretrainedInitConfig(InitConfig):
    name: str = "pretrained"
    path: str = MISSING             # the checkpoint dir (config.json + model.safetensors or a sharded index)
    # checkpoint key prefix -> speculators' prefix
    key_map: dict[str, str] = field(default_factory=lambda: {"midlayer.": "layers.0."})
    # keep: the checkpoint's d2t/t2d | rebuild: the data's mapping, lm_head rows unmoved (wrong: kept as a
    # baseline) | remap: the data's mapping, rows moved to their tokens, new tokens' rows from the verifier's lm_head
    vocab: VocabPolicy = VocabPolicy.remap
    train_lm_head: bool = False     # speculators freezes the draft lm_head; SpecForge trains it
    # finetuning: below a scratch lr; the launcher warns outside it
    recommended_lr: list[float] = field(default_factory=lambda: [1e-6, 3e-5])

    def check_source(self) -> None:
        # Its files, keys and shapes are the initializer's preflight (eagle3/init/pretrained.py), once the data is
        # built; a path that is not there is known before.
        require_dir(self.path, "init.path", ["config.json"], "a draft checkpoint dir with config.json and "
                    "model.safetensors (or a sharded index)")


# init.name -> its options' schema: how a run dir's resolved config finds the type of its `init`.
INIT_SCHEMAS: dict[str, type[InitConfig]] = {"scratch": ScratchInitConfig, "pretrained": PretrainedInitConfig}


@dataclass
class OptimConfig:
    """AdamW with warmup and decay; the defaults follow SpecForge/EAGLE practice for real drafters."""

    lr: float = 1e-4                # peak learning rate
    epochs: int = 1                 # passes over the training split
    max_steps: int | None = None    # optimizer steps cap across epochs; null = no cap, 0 = only the step-0 eval
    warmup_ratio: float = 0.015     # share of the total steps spent warming up linearly from 0
    weight_decay: float = 0.0       # AdamW decoupled weight decay
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])   # AdamW betas
    grad_clip: float = 0.5          # max global grad norm
    # cosine | linear | constant (after warmup). Cosine decays over the run's planned steps: on SmolLM2 its last 40%
    # added ~0.1 to tau_sim, so a budget chosen in advance, the decay ending on it, is part of a recipe
    scheduler: Scheduler = Scheduler.cosine
    # micro-batches per optimizer step on each rank; global batch in tokens = data.total_seq_len * grad_accum *
    # world size
    grad_accum: int = 1
    checkpoint_every: int | None = None   # optimizer steps between resumable `last` checkpoints; null = each epoch end
    eval_every: int | None = None   # optimizer steps between val passes (and `best` updates) besides epoch ends
    # steps in a row with a non-finite loss or gradient (skipped, not applied) before the run stops, saving
    # checkpoints/last
    max_skipped_steps: int = 10

    def check(self) -> None:
        require(math.isfinite(self.lr) and self.lr > 0, "optim.lr", f"must be a positive number, got {self.lr}")
        require(self.epochs >= 1, "optim.epochs", f"must be at least 1, got {self.epochs}")
        require(self.max_steps is None or self.max_steps >= 0, "optim.max_steps", "must be null or >= 0")
        require(0 <= self.warmup_ratio < 1, "optim.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        require(self.grad_clip > 0, "optim.grad_clip", "must be > 0")
        require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas",
                "must be two numbers in [0, 1)")
        require(self.grad_accum >= 1, "optim.grad_accum", f"must be at least 1, got {self.grad_accum}")
        require(self.max_skipped_steps >= 1, "optim.max_skipped_steps", "must be at least 1")
        for key in ("checkpoint_every", "eval_every"):
            every = getattr(self, key)
            require(every is None or every >= 1, f"optim.{key}", "must be null or >= 1")


@dataclass
class DistributedConfig:
    name: str = MISSING
    strategy: Strategy = Strategy.ddp      # ddp | fsdp
    nproc_per_node: int = 1                 # ranks (processes) on this node; one per GPU on CUDA
    nnodes: int = 1                         # nodes in the job
    # GB of memory per device for the plan's fit check when no GPU is visible (plan=true on a laptop; the plan
    # then assumes a GPU run); null: a visible GPU's free memory (torch.cuda.mem_get_info), else no check.
    device_memory_gb: float | None = None
    # This node's index, 0 .. nnodes-1. MISSING, not 0: multinode must not default it silently.
    node_rank: int = MISSING
    rdzv_endpoint: str | None = MISSING     # host:port on node 0 that every node can reach; null: a free local port
    backend: Backend = Backend.auto         # auto: nccl on CUDA, gloo on CPU | nccl | gloo

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def check(self) -> None:
        require(self.nproc_per_node >= 1, "distributed.nproc_per_node", "must be >= 1")
        memory = self.device_memory_gb
        require(memory is None or (math.isfinite(memory) and memory > 0), "distributed.device_memory_gb",
                f"must be null or a positive number of GB, got {memory}")
        require(self.nnodes >= 1, "distributed.nnodes", "must be >= 1")
        require(0 <= self.node_rank < self.nnodes, "distributed.node_rank",
                f"must be in [0, distributed.nnodes={self.nnodes})")
        require(self.nnodes == 1 or bool(self.rdzv_endpoint), "distributed.rdzv_endpoint",
                "is required with more than one node: host:port of node 0, reachable from every node")


@dataclass
class LoggerConfig:
    mode: LoggerMode = LoggerMode.offline   # offline | online | disabled
    project: str = "eagle3"
    entity: str | None = None               # wandb team or user; null = your default
    tags: list[str] = field(default_factory=list)   # extra wandb tags
    log_every: int = 10                     # optimizer steps between train rows in metrics.jsonl and wandb


@dataclass
class AcceptEvalConfig:
    """Measured acceptance at val passes: chain speculative decoding with the verifier in the training process
    (eagle3/eval). Only for verifiers that fit beside the draft; off by default. `eagle3 accept`
    takes its option defaults from here."""

    enabled: bool = False           # true: measure at val passes (not with FSDP across ranks)
    # rows of {"input_ids": [...]} or conversations ({"messages"}, ShareGPT's {"conversations"}; a conversation's
    # prompt is everything before its first assistant turn) in any file eagle3.data.prepare reads; null: the val
    # split's prompts
    prompts: str | None = None
    num_prompts: int = 8            # prompts decoded per measurement (the first N)
    k: int = 3                      # draft tokens proposed per verifier forward (conf/train.yaml: the ttt_steps)
    max_new_tokens: int = 32        # tokens generated per prompt
    every: int = 1                  # measure at every N-th val pass (1: all of them, the step-0 pass included)
    temperature: float = 0.0        # sampling temperature (0: greedy; > 0: speculative sampling, seeded by `seed`)

    def check_values(self) -> None:
        """Its values' ranges; also what `eagle3 accept` checks its options with."""
        for key, low in (("k", 1), ("num_prompts", 1), ("every", 1)):
            value = getattr(self, key)
            require(value >= low, f"eval.accept.{key}", f"must be >= {low}, got {value}")
        require(self.max_new_tokens >= 2, "eval.accept.max_new_tokens",
                f"must be >= 2 (the first token comes from the prompt's forward, without a draft), "
                f"got {self.max_new_tokens}")
        require_temperature("eval.accept.temperature", self.temperature)

    def check(self, dist: DistributedConfig) -> None:
        # The verifier it needs always exists: ModelConfig.check requires model.verifier.path or .tiny.
        self.check_values()
        if not self.enabled:
            return
        require(dist.strategy != Strategy.fsdp or dist.world_size == 1, "eval.accept.enabled",
                "needs the whole draft in rank 0, and FSDP shards it; measure the saved checkpoint afterwards with "
                "eagle3 accept --run <run dir>")
        if self.prompts is not None:
            problem = rows_path_problem(Path(self.prompts))  # its rows are read at the first val pass
            require(problem is None, "eval.accept.prompts", f"{self.prompts} {problem}; expected {ROWS_FILES}")


@dataclass
class ServeEvalConfig:
    """At the end of a run, its checkpoints/best served by vLLM (eagle3 serve RUN) on eval.accept's
    prompts, token budget and temperature; off by default."""

    enabled: bool = False
    # a list of k, one report each (serve_vllm_k<k>_t<T>.json); null: the checkpoint's (its ttt_steps)
    k: list[int] | None = None
    python: str | None = None      # the engine's interpreter; null: $EAGLE3_VLLM_PYTHON, else the --install venv

    def check_values(self) -> None:
        """Its values' ranges; also what `eagle3 serve` checks its --k with."""
        require(self.k is None or (len(self.k) > 0 and min(self.k) >= 1), "eval.serve.k",
                f"must be null or a list of k >= 1, got {self.k}")


@dataclass
class EvalConfig:
    accept: AcceptEvalConfig = field(default_factory=AcceptEvalConfig)
    serve: ServeEvalConfig = field(default_factory=ServeEvalConfig)


@dataclass
class OnPolicyConfig:
    """On-policy rollouts of the draft (eagle3/train/on_policy.py): from optimizer step `start_step` on, every `every`
    steps each rank decodes `num_prompts` train prompts speculatively with the current draft (k = its ttt_steps, at
    `temperature`) and mixes the loss on those verify rounds into the step at `mix` (share of the loss)."""

    enabled: bool = False
    start_step: int = 0
    every: int = 1
    temperature: float = 0.0
    num_prompts: int = 4
    max_new_tokens: int = 32
    mix: float = 0.5

    def check(self, dist: DistributedConfig) -> None:
        for key, low in (("start_step", 0), ("every", 1), ("num_prompts", 1), ("max_new_tokens", 2)):
            value = getattr(self, key)
            require(value >= low, f"train.on_policy.{key}", f"must be >= {low}, got {value}")
        require_temperature("train.on_policy.temperature", self.temperature)
        require(0 < self.mix <= 1, "train.on_policy.mix", f"is the rollouts' share of the loss, in (0, 1]; got "
                                                          f"{self.mix}")
        require(not self.enabled or dist.strategy != Strategy.fsdp or dist.world_size == 1,
                "train.on_policy.enabled", "runs the whole draft in each rank, and FSDP shards it; use "
                                          "distributed=ddp")


@dataclass
class LoopConfig:
    on_policy: OnPolicyConfig = field(default_factory=OnPolicyConfig)


def lr_advice(optim: OptimConfig, init: InitConfig) -> tuple[str, bool]:
    """The lr next to the initializer's recommended range, and whether it lies outside it."""
    lr, (low, high) = optim.lr, init.recommended_lr
    outside = not low <= lr <= high
    text = f"optim.lr={lr:g}; init={init.name} recommends {low:g} .. {high:g}"
    if outside:
        text += (" (above: a pretrained drafter's representations are easily destroyed; a finetune lr should be "
                 "below the scratch lr)" if lr > high else " (below: training will barely move)")
    return text, outside
