"""Typed schemas of the run config, registered in Hydra's ConfigStore.

Every YAML option in `conf/<group>/` starts from one of these schemas (its `defaults: [base_<x>]`), so a
wrong type or an unknown key fails at composition with Hydra's own message. Range checks that a type
cannot express live in `validate()`, which the launcher runs once before anything is written.

This module imports neither torch nor speculators: `launch.py --help` and `--cfg job` go through it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf


class ConfigError(ValueError):
    """A problem the user can fix in the config or on disk; reported as one message, no traceback."""


class Scheduler(str, Enum):
    cosine = "cosine"
    linear = "linear"
    constant = "constant"


class LoggerMode(str, Enum):
    offline = "offline"
    online = "online"
    disabled = "disabled"


class BadSamplePolicy(str, Enum):
    error = "error"
    skip = "skip"


class Strategy(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"


@dataclass
class TinyVerifierConfig:
    """A small Llama built from a seed, used when no verifier path is given."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 256
    vocab_size: int = 1024
    max_position_embeddings: int = 512
    init_std: float = 0.02
    logit_scale: float = 40.0
    seed: int = 0
    # A "next version" of the same model (e.g. K2 -> K2.5): relative noise on every weight, and a share of
    # the vocabulary whose lm_head rows trade places, so that other tokens become frequent.
    perturb_std: float = 0.0
    token_shift: float = 0.0
    perturb_seed: int = 1


@dataclass
class VerifierConfig:
    # MISSING, not None: a YAML `???` merged onto a default keeps the default, so options that need a
    # user-given path would silently get null.
    path: Optional[str] = MISSING
    tiny: Optional[TinyVerifierConfig] = None


@dataclass
class DraftConfig:
    hidden_size: int = MISSING
    intermediate_size: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: int = MISSING
    vocab_size: int = MISSING
    draft_vocab_size: int = MISSING
    aux_layer_ids: list[int] = MISSING
    max_position_embeddings: int = 4096
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    ttt_steps: int = 3
    ttt_step_loss_decay: float = 1.0
    loss: str = "kl_div"
    attn_impl: str = "auto"
    # Architecture flags; null = as the initializer says (scratch: speculators' defaults; pretrained: the
    # checkpoint's, or its layout's known defaults).
    norm_before_residual: Optional[bool] = None
    norm_before_fc: Optional[bool] = None
    norm_output: Optional[bool] = None
    fc_norm: Optional[bool] = None


@dataclass
class ModelConfig:
    name: str = MISSING
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)


@dataclass
class SynthConfig:
    """Sequences sampled from the verifier itself (like regenerated responses)."""

    num_samples: int = 512
    prompt_len: int = 16
    response_len: int = 112
    temperature: float = 1.0
    batch_size: int = 64
    seed: int = 0


@dataclass
class DataConfig:
    name: str = MISSING
    path: Optional[str] = MISSING
    synth: Optional[SynthConfig] = None
    total_seq_len: int = 1024
    train_ratio: float = 0.9
    prefetch: int = 2
    hidden_states_dtype: str = "bfloat16"
    on_bad_sample: BadSamplePolicy = BadSamplePolicy.error


class VocabPolicy(str, Enum):
    keep = "keep"
    rebuild = "rebuild"
    remap = "remap"


@dataclass
class ScratchInitConfig:
    name: str = "scratch"
    recommended_lr: list[float] = field(default_factory=lambda: [1e-5, 3e-3])


@dataclass
class PretrainedInitConfig:
    name: str = "pretrained"
    path: str = MISSING
    key_map: dict[str, str] = field(default_factory=lambda: {"midlayer.": "layers.0."})
    vocab: VocabPolicy = VocabPolicy.remap
    train_lm_head: bool = False
    recommended_lr: list[float] = field(default_factory=lambda: [1e-6, 3e-5])


@dataclass
class OptimConfig:
    lr: float = 1e-4
    epochs: int = 1
    max_steps: Optional[int] = None
    warmup_ratio: float = 0.015
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 0.5
    scheduler: Scheduler = Scheduler.cosine
    grad_accum: int = 1
    checkpoint_every: Optional[int] = None
    eval_every: Optional[int] = None
    max_skipped_steps: int = 10


@dataclass
class DistributedConfig:
    name: str = MISSING
    strategy: Strategy = Strategy.ddp
    nproc_per_node: int = 1
    nnodes: int = 1
    node_rank: int = MISSING                # MISSING, not 0: multinode must not default it silently
    rdzv_endpoint: Optional[str] = MISSING
    backend: str = "auto"
    max_restarts: int = 0


@dataclass
class LoggerConfig:
    mode: LoggerMode = LoggerMode.offline
    project: str = "eagle3"
    entity: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    log_every: int = 10


@dataclass
class AcceptEvalConfig:
    """Measured acceptance at val passes: chain speculative decoding with the verifier in the training process
    (eagle3/eval). Only for verifiers that fit beside the draft; off by default."""

    enabled: bool = False
    prompts: Optional[str] = None   # JSONL of input_ids or messages rows; null: the val split's prompts
    num_prompts: int = 8
    k: int = 3
    max_new_tokens: int = 32
    every: int = 1                  # measure at every N-th val pass, the step-0 pass first


@dataclass
class EvalConfig:
    accept: AcceptEvalConfig = field(default_factory=AcceptEvalConfig)


@dataclass
class TrainConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    init: Any = MISSING
    optim: OptimConfig = MISSING
    distributed: DistributedConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    seed: int = 0
    cache_dir: str = MISSING
    device: str = "auto"
    resume: Optional[str] = None


def register_configs() -> None:
    # Sweep sub-dir names come from the overrides; `experiment=k2_to_k25/remap` must not nest a directory.
    if not OmegaConf.has_resolver("dirname_safe"):
        OmegaConf.register_new_resolver("dirname_safe", lambda s: str(s).replace("/", "-"))
    from eagle3.verifier_shape import register_resolvers  # model=auto: ${verifier_config:<path>,<key>}

    register_resolvers()
    cs = ConfigStore.instance()
    cs.store(name="base_train", node=TrainConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="data", name="base_data", node=DataConfig)
    cs.store(group="init", name="base_scratch", node=ScratchInitConfig)
    cs.store(group="init", name="base_pretrained", node=PretrainedInitConfig)
    cs.store(group="optim", name="base_optim", node=OptimConfig)
    cs.store(group="distributed", name="base_distributed", node=DistributedConfig)
    cs.store(group="logger", name="base_logger", node=LoggerConfig)


def _require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def validate(cfg: dict[str, Any]) -> None:
    """Checks a resolved run config for values a type cannot rule out; raises ConfigError naming the key."""
    optim, data, draft = cfg["optim"], cfg["data"], cfg["model"]["draft"]
    _require(math.isfinite(optim["lr"]) and optim["lr"] > 0, "optim.lr", f"must be a positive number, got {optim['lr']}")
    _require(optim["epochs"] >= 1, "optim.epochs", f"must be at least 1, got {optim['epochs']}")
    _require(optim["max_steps"] is None or optim["max_steps"] >= 0, "optim.max_steps", "must be null or >= 0")
    _require(0 <= optim["warmup_ratio"] < 1, "optim.warmup_ratio", f"must be in [0, 1), got {optim['warmup_ratio']}")
    _require(optim["weight_decay"] >= 0, "optim.weight_decay", "must be >= 0")
    _require(optim["grad_clip"] > 0, "optim.grad_clip", "must be > 0")
    _require(len(optim["betas"]) == 2 and all(0 <= b < 1 for b in optim["betas"]), "optim.betas", "must be two numbers in [0, 1)")
    _require(0 < data["train_ratio"] < 1, "data.train_ratio", f"must be in (0, 1), got {data['train_ratio']}")
    _require(data["total_seq_len"] > 0, "data.total_seq_len", "must be > 0")
    _require(data["prefetch"] >= 0, "data.prefetch", f"must be >= 0, got {data['prefetch']}")
    _require(draft["ttt_steps"] >= 1, "model.draft.ttt_steps", "must be >= 1")
    _require(0 < draft["draft_vocab_size"] <= draft["vocab_size"], "model.draft.draft_vocab_size",
             f"must be in (0, model.draft.vocab_size={draft['vocab_size']}]")
    _require(draft["attn_impl"] in ("auto", "sdpa", "eager", "simple_flex_attention"), "model.draft.attn_impl",
             "must be auto, sdpa, eager or simple_flex_attention")
    _require(cfg["device"] in ("auto", "cpu", "cuda"), "device", "must be auto, cpu or cuda")
    _require(optim["grad_accum"] >= 1, "optim.grad_accum", f"must be at least 1, got {optim['grad_accum']}")
    _require(optim["max_skipped_steps"] >= 1, "optim.max_skipped_steps", "must be at least 1")
    for key in ("checkpoint_every", "eval_every"):
        _require(optim[key] is None or optim[key] >= 1, f"optim.{key}", "must be null or >= 1")
    dist = cfg["distributed"]
    _require(dist["nproc_per_node"] >= 1, "distributed.nproc_per_node", "must be >= 1")
    _require(dist["nnodes"] >= 1, "distributed.nnodes", "must be >= 1")
    _require(0 <= dist["node_rank"] < dist["nnodes"], "distributed.node_rank",
             f"must be in [0, distributed.nnodes={dist['nnodes']})")
    _require(dist["nnodes"] == 1 or bool(dist["rdzv_endpoint"]), "distributed.rdzv_endpoint",
             "is required with more than one node: host:port of node 0, reachable from every node")
    _require(dist["backend"] in ("auto", "nccl", "gloo"), "distributed.backend", "must be auto, nccl or gloo")
    _require(dist["max_restarts"] >= 0, "distributed.max_restarts", "must be >= 0")
    _validate_accept_eval(cfg["eval"]["accept"], dist)
    verifier = cfg["model"]["verifier"]
    _require(verifier["path"] is None or verifier["tiny"] is None, "model.verifier.path",
             f"model={cfg['model']['name']} builds its own tiny verifier and sizes the draft after it; for your own "
             "verifier use model=auto model.verifier.path=<dir> (the draft's shape is read from its config.json)")
    _require((verifier["path"] is None) != (verifier["tiny"] is None), "model.verifier",
             "set exactly one of model.verifier.path (a local Hugging Face model dir) and model.verifier.tiny")
    if verifier["path"] is not None:
        _require_dir(verifier["path"], "model.verifier.path", ["config.json"],
                     "a local Hugging Face model dir with config.json and model.safetensors (or its index)")
    _require((data["path"] is None) != (data["synth"] is None), "data",
             "set exactly one of data.path (a speculators-format dataset) and data.synth")
    if data["path"] is not None:
        _require_dir(data["path"], "data.path", ["hidden_states"],
                     "a speculators-format dataset: Arrow rows (input_ids, loss_mask, seq_len) saved with "
                     "datasets.save_to_disk, hidden_states/hs_<i>.safetensors and token_freq.pt")


def _validate_accept_eval(accept: dict[str, Any], dist: dict[str, Any]) -> None:
    # The verifier it needs always exists: validate() requires model.verifier.path or model.verifier.tiny.
    for key, low in (("k", 1), ("num_prompts", 1), ("max_new_tokens", 2), ("every", 1)):
        _require(accept[key] >= low, f"eval.accept.{key}", f"must be >= {low}, got {accept[key]}")
    if not accept["enabled"]:
        return
    _require(dist["strategy"] != "fsdp" or dist["nproc_per_node"] * dist["nnodes"] == 1, "eval.accept.enabled",
             "needs the whole draft in rank 0, and FSDP shards it; measure the saved checkpoint afterwards with "
             "python -m eagle3.eval.accept --run <run dir>")
    if accept["prompts"] is not None:
        _require(Path(accept["prompts"]).is_file(), "eval.accept.prompts",
                 f"{accept['prompts']} does not exist or is not a file; expected a JSONL of input_ids or messages rows")


def lr_advice(cfg: dict[str, Any]) -> tuple[str, bool]:
    """The lr next to the initializer's recommended range, and whether it lies outside it."""
    lr, (low, high) = cfg["optim"]["lr"], cfg["init"]["recommended_lr"]
    outside = not low <= lr <= high
    text = f"optim.lr={lr:g}; init={cfg['init']['name']} recommends {low:g} .. {high:g}"
    if outside:
        text += (" (above: a pretrained drafter's representations are easily destroyed; a finetune lr should be "
                 "below the scratch lr)" if lr > high else " (below: training will barely move)")
    return text, outside


def _require_dir(path: str, key: str, entries: list[str], what: str) -> None:
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{key}: {path} does not exist or is not a directory; expected {what}")
    missing = [e for e in entries if not (p / e).exists()]
    if missing:
        raise ConfigError(f"{key}: {path} has no {', '.join(missing)}; expected {what}")
