"""The run config's types: the schemas Hydra composes into, their range checks, and the typed run config.

Every YAML option in `conf/<group>/` starts from one of these schemas (its `defaults: [base_<x>]`), so a
wrong type or an unknown key fails at composition with Hydra's own message. `run_config()` turns the plain,
resolved config (freshly composed, or a run dir's resolved_config.yaml) into a `RunConfig` instance through the
same schemas, refusing keys no schema has (a `+key=` override, an edited file), and runs each part's
`check()` for what a type cannot rule out. Code past the launcher reads attributes (`cfg.optim.lr`) and takes
the part it needs.

This module imports neither torch nor speculators: `launch.py --help` and `--cfg job` go through it.
"""

from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from eagle3.errors import ConfigError


def _require(ok: bool, key: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"{key}: {problem}")


def require_temperature(key: str, value: float, greedy: bool = True) -> None:
    """The one check of every sampling temperature (`key` names it): finite, and >= 0 where 0 means greedy
    (`greedy`), else > 0. NaN would sample from NaN logits, and inf from a uniform distribution whatever the
    verifier says: tokens no model would write, silently trained on or measured."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = number and math.isfinite(value) and (value >= 0 if greedy else value > 0)
    _require(ok, key, f"must be >= 0 and finite, got {value}" if greedy else
             f"must be > 0 and finite (it samples, never greedy), got {value}")


class LayerType(str, Enum):
    """The draft's decoder layer: transformers' model_type, as speculators and vLLM read it."""

    llama = "llama"
    qwen3 = "qwen3"


class DraftKind(str, Enum):
    """How the draft proposes k tokens: eagle3, one forward per token (k TTT steps in training); peagle, all k in
    one forward (P-EAGLE); dflash, a block of k + 1 (the last verified token and k mask tokens) in one
    non-causal forward (DFlash)."""

    eagle3 = "eagle3"
    peagle = "peagle"
    dflash = "dflash"


# model.draft.block_size's range for kind=dflash: the anchor and at least one draft token; at most what a
# DFlash drafter is published with (16) times four.
DFLASH_BLOCK_RANGE = (2, 64)


# The draft's norm flags, its layer type and kind: the schema's values and rules (eagle3/arch/draft.py builds from
# them).
FLAGS = ("norm_before_residual", "norm_before_fc", "norm_output", "fc_norm")
# speculators' training defaults for a fresh EAGLE-3 draft (its `speculators train` flags).
SPECULATORS_FLAGS = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False}
# EAGLE-3.1 (`model.draft.eagle31=true`): one RMSNorm per aux hidden state before fc (speculators refuses it
# together with norm_before_fc), and the normed output fed to the next step.
EAGLE31_FLAGS = {"norm_before_residual": True, "norm_before_fc": False, "norm_output": True, "fc_norm": True}


def run_flags(draft: DraftConfig) -> dict[str, bool | None]:
    """The norm flags as the run's config sets them (None: as the initializer says)."""
    return {k: getattr(draft, k) for k in FLAGS}


def asked_flags(draft: DraftConfig) -> dict[str, bool | None]:
    """The norm flags the run asks for: its own, EAGLE-3.1's where it leaves one null with eagle31=true; None:
    as the initializer says."""
    asked = run_flags(draft)
    if draft.eagle31:
        asked = {k: EAGLE31_FLAGS[k] if v is None else v for k, v in asked.items()}
    return asked


def kind_flag_problem(kind: DraftKind | str, flags: Mapping[str, bool | None]) -> str | None:
    """Why a draft of `kind` cannot have these norm flags, or None: the one rule that the run's config check (before
    any rank starts), init=pretrained and export (eagle3/serve/parity.py) all apply. vLLM, the one engine with
    parallel drafting, reads a P-EAGLE config's norm_before_residual and norm_before_fc only: per-aux fc_norm
    (EAGLE-3.1's) would be served without the norms it was trained with."""
    if DraftKind(kind) == DraftKind.peagle and flags.get("fc_norm"):
        return "fc_norm=true: vLLM's P-EAGLE config reader drops fc_norm (EAGLE-3.1's per-aux norms)"
    return None


def flag_conflicts(draft: DraftConfig) -> list[str]:
    """Flag settings speculators would refuse, or that contradict model.draft.eagle31, in the config's words."""
    problems = []
    if draft.norm_before_fc and draft.fc_norm:
        problems.append("norm_before_fc=true and fc_norm=true: one norm before fc or one per aux state, not both")
    if draft.eagle31:
        for k, v in run_flags(draft).items():
            if v is not None and k != "norm_before_residual" and v != EAGLE31_FLAGS[k]:
                problems.append(f"{k}={str(v).lower()} contradicts eagle31=true "
                                f"(EAGLE-3.1 has {k}={str(EAGLE31_FLAGS[k]).lower()})")
    return problems


# A verifier's sizes (HF config.json keys) that must be positive integers.
SIZE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
             "intermediate_size", "vocab_size", "max_position_embeddings")


def shape_problems(config: dict[str, Any]) -> list[str]:
    """What no decoder could have in `config` (HF keys): sizes that are not positive integers, key/value heads that
    do not divide the query heads, a hidden size the heads do not divide without a head_dim. [] when none."""
    problems = [f"{key}={config[key]!r} (a size: must be a positive integer)" for key in SIZE_KEYS
                if config.get(key) is not None
                and (isinstance(config[key], bool) or not isinstance(config[key], int) or config[key] < 1)]
    if problems:
        return problems
    heads, kv, hidden = config.get("num_attention_heads"), config.get("num_key_value_heads"), config.get("hidden_size")
    if heads and kv and kv > heads:
        problems.append(f"num_key_value_heads={kv} > num_attention_heads={heads} (each key/value head serves one "
                        f"or more query heads)")
    elif heads and kv and heads % kv:
        problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv} (grouped-query "
                        f"attention gives each key/value head the same number of query heads)")
    if heads and hidden and not config.get("head_dim") and "kv_lora_rank" not in config and hidden % heads:
        problems.append(f"hidden_size={hidden} is not a multiple of num_attention_heads={heads}, and no head_dim "
                        f"is given (head_dim = hidden_size / heads)")
    return problems


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


class RowFormat(str, Enum):
    """What a data file's rows hold (eagle3/formats/row_formats.py reads each): `auto` takes the first row's format."""

    auto = "auto"
    tokens = "tokens"       # {"input_ids": [...], "loss_mask": [...]} (speculators' rows)
    messages = "messages"   # {"messages": [{"role", "content"}, ...]} (OpenAI's chat format)
    sharegpt = "sharegpt"   # {"conversations": [{"from", "value"}, ...]} (ShareGPT's)


class Objective(str, Enum):
    """What a run returns to a sweeper (eagle3/sweep/objective.py): its best val tau_sim, or the measured acceptance
    of that val pass."""

    tau_sim = "tau_sim"
    accept_len = "accept_len"


class Strategy(str, Enum):
    ddp = "ddp"
    fsdp = "fsdp"


class Device(str, Enum):
    """Where a run trains; auto: a CUDA GPU when torch sees one, else the CPU (eagle3/device/choice.py resolves it)."""

    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Backend(str, Enum):
    """The process group's backend; auto: nccl on CUDA, gloo on CPU."""

    auto = "auto"
    nccl = "nccl"
    gloo = "gloo"


class AttnImpl(str, Enum):
    """The draft's attention; auto: flex attention on CUDA, sdpa on CPU (flex has no CPU backward)."""

    auto = "auto"
    sdpa = "sdpa"
    eager = "eager"
    simple_flex_attention = "simple_flex_attention"


class DraftLoss(str, Enum):
    """speculators' loss names (speculators.losses.resolve_loss_config)."""

    kl_div = "kl_div"
    ce = "ce"
    rkl = "rkl"
    jsd = "jsd"
    tv = "tv"
    nla = "nla"
    lk_hybrid = "lk_hybrid"


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
    # A local Hugging Face model dir: config.json plus the safetensors holding embed_tokens, lm_head and the final
    # norm (the draft shares them); null with `tiny`.
    path: str | None = MISSING
    tiny: TinyVerifierConfig | None = None

    def check(self) -> None:
        _require((self.path is None) != (self.tiny is None), "model.verifier",
                 "set exactly one of model.verifier.path (a local Hugging Face model dir) and model.verifier.tiny")
        if self.path is not None:
            require_dir(self.path, "model.verifier.path", ["config.json"],
                         "a local Hugging Face model dir with config.json and model.safetensors (or its index)")
        if self.tiny is not None:
            t = self.tiny
            problems = "; ".join(shape_problems({
                "hidden_size": t.hidden_size, "num_hidden_layers": t.num_layers, "num_attention_heads": t.num_heads,
                "intermediate_size": t.intermediate_size, "vocab_size": t.vocab_size,
                "max_position_embeddings": t.max_position_embeddings}))
            _require(not problems, "model.verifier.tiny", "a verifier no model could have: " + problems.replace(
                "num_hidden_layers", "num_layers").replace("num_attention_heads", "num_heads"))


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
    # The rest of the verifier's RoPE (eagle3/arch/rope.py): rope_type and its factors as its config states them
    # (llama3, yarn, ...; null: default RoPE), and the share of each head it rotates (1.0 only). (Typed Any: Hydra
    # resolves an interpolation into a dict-typed node while composing, before model.verifier.path is set.)
    rope_scaling: Any = None
    partial_rotary_factor: float = 1.0
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    # The draft's decoder layers (eagle3/arch/draft.py): how many (layer 0 reads [embedding, hidden]), and of
    # which transformers type (llama | qwen3: a Qwen3 layer adds q/k norms).
    num_layers: int = 1
    layer_type: LayerType = LayerType.llama
    ttt_steps: int = 3              # draft tokens trained per position (test-time training steps)
    ttt_step_loss_decay: float = 1.0   # weight of step k's loss is decay**k
    loss: DraftLoss = DraftLoss.kl_div   # speculators loss name: kl_div | ce | rkl | jsd | tv | nla | lk_hybrid
    attn_impl: AttnImpl = AttnImpl.auto   # auto: simple_flex_attention on CUDA, sdpa on CPU | sdpa | eager
    # Architecture flags; null = as the initializer says (scratch: speculators' training defaults true, true, true,
    # false; pretrained: what the checkpoint states, else its layout's known defaults).
    norm_before_residual: bool | None = None   # RMSNorm the incoming hidden state before the first residual add
    norm_before_fc: bool | None = None         # one RMSNorm over the concatenated aux hidden states before fc
    norm_output: bool | None = None            # feed the normed output, not the raw one, into the next TTT step
    fc_norm: bool | None = None                # one RMSNorm per aux hidden state before fc (not norm_before_fc)
    # EAGLE-3.1: the null flags take fc_norm=true, norm_before_fc=false, norm_output=true (EAGLE31_FLAGS above).
    eagle31: bool = False
    # eagle3: one forward per draft token; peagle: P-EAGLE, all ttt_steps tokens in one forward (eagle3/arch/draft.py).
    kind: DraftKind = DraftKind.eagle3
    # P-EAGLE's and DFlash's masked slots' input token (null: the verifier vocabulary's last id).
    mask_token_id: int | None = None
    # DFlash (kind=dflash): tokens per block, the last verified token and the ttt_steps tokens it drafts (null:
    # ttt_steps + 1; set, it must equal ttt_steps + 1). Its decoder layers are speculators' Qwen3 DFlash layers
    # (num_layers of them), reading the verifier's aux_layer_ids through fc.
    block_size: int | None = None
    # Recompute the decoder layer in the backward instead of keeping its activations
    # (eagle3/arch/activation_checkpointing.py): less activation memory for about one more layer forward per TTT step.
    gradient_checkpointing: bool = False

    def check(self) -> None:
        sizes = {key: getattr(self, key) for key in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                                     "head_dim", "intermediate_size", "vocab_size",
                                                     "max_position_embeddings")}
        # head_dim is given: the draft's heads need not divide its hidden size (q_proj maps H to heads x head_dim).
        problems = shape_problems(sizes)
        _require(not problems, "model.draft", f"a draft no model could have: {'; '.join(problems)}")
        for key in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, key)
            _require(math.isfinite(value) and value > 0, f"model.draft.{key}", f"must be positive, got {value}")
        _require(self.ttt_steps >= 1, "model.draft.ttt_steps", "must be >= 1")
        _require(self.num_layers >= 1, "model.draft.num_layers", f"must be >= 1, got {self.num_layers}")
        conflicts = flag_conflicts(self)
        _require(not conflicts, "model.draft", "; ".join(conflicts))
        unservable = kind_flag_problem(self.kind, asked_flags(self))
        _require(unservable is None, "model.draft.kind",
                 f"peagle with EAGLE-3.1's norms (eagle31=true or fc_norm=true) trains a draft no engine serves as "
                 f"trained ({unservable}; export refuses it): drop model.draft.eagle31/fc_norm to train P-EAGLE, or "
                 f"train EAGLE-3.1 with model.draft.kind=eagle3")
        if self.kind == DraftKind.peagle:
            _require(self.ttt_step_loss_decay == 1.0, "model.draft.ttt_step_loss_decay",
                     "P-EAGLE weighs its depths as speculators' PEagleDraftModel does (equally); leave it at 1.0")
        _require(self.mask_token_id is None or self.kind != DraftKind.eagle3, "model.draft.mask_token_id",
                 f"is the input token of P-EAGLE's or DFlash's masked slots, and model.draft.kind="
                 f"{self.kind.value} has none: drop it, or set model.draft.kind=peagle or dflash")
        self._check_dflash()
        _require(self.mask_token_id is None or 0 <= self.mask_token_id < self.vocab_size, "model.draft.mask_token_id",
                 f"must be a token id in [0, model.draft.vocab_size={self.vocab_size}), got {self.mask_token_id}")
        _require(0 < self.draft_vocab_size <= self.vocab_size, "model.draft.draft_vocab_size",
                 f"must be in (0, model.draft.vocab_size={self.vocab_size}]")
        ids = list(self.aux_layer_ids)
        _require(len(ids) > 0, "model.draft.aux_layer_ids", "must name at least one verifier layer")
        _require(len(set(ids)) == len(ids), "model.draft.aux_layer_ids",
                 f"{ids} names a layer twice; each aux layer feeds the draft once")
        _require(min(ids) >= 0, "model.draft.aux_layer_ids", f"{ids}: layer ids are >= 0")
        _require(self.partial_rotary_factor == 1.0, "model.draft.partial_rotary_factor",
                 f"is {self.partial_rotary_factor} (model=auto: the verifier's), but the draft's Llama layer rotates "
                 "whole heads (transformers' default Llama RoPE has no partial rotation, vLLM and SGLang would "
                 "rotate a share): set model.draft.partial_rotary_factor=1.0 to train a draft that rotates whole "
                 "heads, as speculators' own trainer does; the export states it, so engines rotate as it was trained")
        _require(self.rope_scaling is None or (isinstance(self.rope_scaling, dict)
                                               and isinstance(self.rope_scaling.get("rope_type"), str)),
                 "model.draft.rope_scaling", "names its rope_type (llama3, yarn, linear, ...), or is null")

    def _check_dflash(self) -> None:
        """kind=dflash's own keys, and the EAGLE-3 keys it has no use for, refused when set."""
        if self.kind != DraftKind.dflash:
            _require(self.block_size is None, "model.draft.block_size",
                     f"is DFlash's block, and model.draft.kind={self.kind.value} drafts no blocks: drop it, or set "
                     f"model.draft.kind=dflash")
            return
        lo, hi = DFLASH_BLOCK_RANGE
        _require(lo <= self.ttt_steps + 1 <= hi, "model.draft.ttt_steps",
                 f"is {self.ttt_steps}: a DFlash block of ttt_steps + 1 tokens must hold {lo} to {hi} tokens")
        _require(self.block_size is None or lo <= self.block_size <= hi, "model.draft.block_size",
                 f"must be in [{lo}, {hi}] (the last verified token and 1 to {hi - 1} draft tokens), got "
                 f"{self.block_size}")
        _require(self.block_size is None or self.block_size == self.ttt_steps + 1, "model.draft.block_size",
                 f"is {self.block_size}, which drafts {self.block_size - 1 if self.block_size else 0} tokens per "
                 f"verify step, but model.draft.ttt_steps={self.ttt_steps}: set model.draft.ttt_steps="
                 f"{(self.block_size or 1) - 1} too, or leave block_size null (ttt_steps + 1)")
        set_flags = [k for k, v in run_flags(self).items() if v is not None] + (["eagle31"] if self.eagle31 else [])
        _require(not set_flags, "model.draft.kind",
                 f"dflash has none of EAGLE-3's norm flags ({', '.join(set_flags)} set): drop them")
        _require(self.ttt_step_loss_decay == 1.0, "model.draft.ttt_step_loss_decay",
                 "DFlash weighs its block positions by speculators' own decay (exp(-(j-1)/4)); leave it at 1.0")
        _require(not self.gradient_checkpointing, "model.draft.gradient_checkpointing",
                 "is not supported for kind=dflash (its activations are one block pass, see the plan)")


@dataclass
class ModelConfig:
    name: str = MISSING
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)

    def check(self) -> None:
        # Both set: a model option with its own tiny verifier (model=tiny) got a path; its draft is sized after
        # the tiny one, so training against the path would not fit. Said before verifier.check's generic message.
        _require(self.verifier.path is None or self.verifier.tiny is None, "model.verifier.path",
                 f"model={self.name} builds its own tiny verifier and sizes the draft after it; for your own "
                 "verifier use model=auto model.verifier.path=<dir> (the draft's shape is read from its config.json)")
        self.verifier.check()  # before the draft's: a draft sized after a bad verifier is the verifier's fault
        self.draft.check()
        if self.verifier.tiny is not None:  # a verifier dir's depth is its config.json's (eagle3.verifier.shape)
            check_aux_layers(self.draft.aux_layer_ids, self.verifier.tiny.num_layers)


def check_aux_layers(ids: list[int], depth: int) -> None:
    """model.draft.aux_layer_ids within a verifier of `depth` decoder layers."""
    # The usual choice, distinct and within the depth also for a verifier of a few layers.
    usual = sorted({min(2, depth - 1), depth // 2, max(depth - 3, 0)})
    _require(max(ids) < depth, "model.draft.aux_layer_ids",
             f"{list(ids)} goes beyond the verifier's {depth} decoder layers: ids are in [0, {depth - 1}] "
             f"(hidden_states[i] enters layer i); [2, N//2, N-3] is the usual choice, here {usual}")


@dataclass
class SynthConfig:
    """Sequences sampled from the verifier itself (like regenerated responses): a random prompt masked out of the
    loss, then a sampled response."""

    num_samples: int = 512          # sequences
    prompt_len: int = 16            # tokens of random prompt, excluded from the loss
    response_len: int = 112         # tokens sampled from the verifier, trained on
    temperature: float = 1.0        # sampling temperature of the responses
    batch_size: int = 64            # sequences per verifier forward while sampling
    seed: int = 0

    def check(self) -> None:
        for key in ("num_samples", "prompt_len", "response_len", "batch_size"):
            value = getattr(self, key)
            _require(value >= 1, f"data.synth.{key}", f"must be >= 1, got {value}")
        require_temperature("data.synth.temperature", self.temperature, greedy=False)  # responses are sampled


class HiddenStatesDtype(str, Enum):
    bfloat16 = "bfloat16"
    float16 = "float16"
    float32 = "float32"


MIN_SEQ_LEN = 2  # data.total_seq_len: one input token and its next token, the shortest pair training shifts


def check_total_seq_len(value: int) -> None:
    """data.total_seq_len's range (DataConfig.check; python -m eagle3.data.check --total-seq-len)."""
    _require(value >= MIN_SEQ_LEN, "data.total_seq_len",
             f"must be at least {MIN_SEQ_LEN}, got {value}: a packed micro-batch must hold one token and the next one "
             f"it predicts (training shifts each row by one)")


@dataclass
class DataConfig:
    """What every data source's options have. `name` selects the source: one schema per source (below, named in
    DATA_SCHEMAS as INIT_SCHEMAS names the initializers'), with its own fields and checks; what the launcher, the
    ranks and the plan ask of a source is its behaviour, eagle3/data/sources/ (a `Source` looked up by name)."""

    name: str = MISSING
    total_seq_len: int = 1024       # tokens packed into one batch (per rank)
    train_ratio: float = 0.9        # the first share of the rows trains, the rest validates
    # The dtype hidden states are stored in (offline files) or rounded to (computed in the loop, as files store them)
    hidden_states_dtype: HiddenStatesDtype = HiddenStatesDtype.bfloat16
    # A row that cannot be used (no usable hidden states, tokens or loss mask; ids outside the vocabulary; longer
    # than the verifier's positions): error (stop before training, listing them) | skip (leave it out, counted in
    # data_check.json). NaN/inf hidden states met in a val pass: error (stop the run) | skip (leave the row out of
    # val, counted as skipped_rows in the val row).
    on_bad_sample: BadSamplePolicy = BadSamplePolicy.error

    # Materializing the source writes into cache_dir (the launcher checks it is writable first).
    writes_cache: ClassVar[bool] = True

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        """The source's own rules, given the whole run config for those that involve other parts.
        `dataset_required=False` (plan=true, which reads no data): a dataset path need only name a directory, so a
        run can be planned before its dataset is prepared into it."""
        _require(0 < self.train_ratio < 1, "data.train_ratio", f"must be in (0, 1), got {self.train_ratio}")
        check_total_seq_len(self.total_seq_len)

    def verifier_in_rank(self) -> str | None:
        """"full" (every rank holds a copy) or "sharded" (across the ranks) when the ranks hold the verifier and
        compute the hidden states in the loop; None when the hidden states come from files."""
        return None


@dataclass
class HiddenStateFiles(DataConfig):
    """Rows whose hidden states are files (hidden_states/hs_<i>.safetensors), read ahead by the reader thread."""

    # Micro-batches the reader thread reads ahead (each holds one buffer of (total_seq_len + 1) x (aux layers + 1)
    # x hidden values)
    prefetch: int = 2

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        _require(self.prefetch >= 0, "data.prefetch", f"must be >= 0, got {self.prefetch}")


@dataclass
class OfflineDataConfig(HiddenStateFiles):
    name: str = "offline"
    # Required: python launch.py data=offline data.path=/data/my_dataset; <path>/data-*.arrow (input_ids,
    # loss_mask, seq_len), <path>/hidden_states/hs_<i>.safetensors, token_freq.pt
    path: str = MISSING

    writes_cache: ClassVar[bool] = False

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        require_dir(self.path, "data.path", ["hidden_states"] if dataset_required else [],
                     "a speculators-format dataset: Arrow rows (input_ids, loss_mask, seq_len) saved with "
                     "datasets.save_to_disk, hidden_states/hs_<i>.safetensors and token_freq.pt")


@dataclass
class TokenRows(DataConfig):
    """Token rows whose hidden states the verifier, held by every rank, computes in the loop."""

    # true: shard the verifier across the job's ranks (FSDP2, forward only), for one that does not fit a device;
    # false: a full copy per rank (bf16 on CUDA, fp32 on CPU)
    shard_verifier: bool = False
    # What data.path's rows hold: auto (the first row's format, recorded with the rows) | tokens ({"input_ids",
    # "loss_mask"}) | messages ({"messages": [{"role", "content"}]}) | sharegpt ({"conversations": [{"from",
    # "value"}]}); a row of another format is a bad row
    format: RowFormat = RowFormat.auto
    # Only the first records of data.path are read (bad ones counted among them), the rest of the file never is:
    # the head of a large file such as ShareGPT's 125 MB JSON array. null: every record
    max_records: int | None = None
    # Conversations (messages, ShareGPT rows) whose turns hold more than this many characters in all are left out
    # before they are tokenized, counted in the rows' record (over_max_chars) and the log: a selection by length,
    # such as docs/sharegpt_split.py's (<= 4,000). null: every conversation. Token rows have no characters: refused
    max_chars: int | None = None
    # Disk (GB, 1e9 bytes) for the train rows' hidden states of the first epoch, read back by the later epochs
    # instead of running the verifier again (in the run dir, removed when the run ends; rows beyond it are computed
    # at every epoch). 0: off, every epoch runs the verifier over every row, nothing is written (a run with one
    # epoch gains nothing from it)
    cache_gb: float = 0.0

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        _require(self.max_records is None or 1 <= self.max_records < 2**63, "data.max_records",
                 f"must be null (every record) or at least 1 and below 2**63, got {self.max_records}")
        _require(self.max_chars is None or self.max_chars >= 1, "data.max_chars",
                 f"must be null (every conversation) or at least 1, got {self.max_chars}")
        _require(math.isfinite(self.cache_gb) and self.cache_gb >= 0, "data.cache_gb",
                 f"must be >= 0 (0: off) and finite, got {self.cache_gb}")
        _require(not (self.shard_verifier and self.cache_gb > 0), "data.cache_gb",
                 "keeps hidden states a rank computed alone, and data.shard_verifier=true makes each forward a "
                 "collective every rank must join at every micro-batch: drop data.cache_gb, or the sharding")
        _require(not (self.shard_verifier and run.eval.accept.enabled), "eval.accept.enabled",
                 "measures on rank 0 with the whole verifier, and data.shard_verifier=true shards it across the "
                 "ranks; measure the saved checkpoint afterwards with python -m eagle3.eval.accept --run <run dir>")
        _require(not (self.shard_verifier and run.train.on_policy.enabled), "train.on_policy.enabled",
                 "decodes with the whole verifier in each rank, and data.shard_verifier=true shards it across the "
                 "ranks")

    def verifier_in_rank(self) -> str | None:
        return "sharded" if self.shard_verifier else "full"


@dataclass
class OnlineDataConfig(TokenRows):
    """Rows from data.path, or without one sampled from the verifier as data.synth says (the tiny default's: the
    same rows data=tiny trains on; cached under cache_dir, keyed by their content)."""

    name: str = "online"
    # Token rows: {"input_ids", "loss_mask"} rows, or conversations ({"messages"}, ShareGPT's {"conversations"};
    # rendered with the verifier's chat template, every assistant turn trained) in a JSONL file, a JSON array, a
    # Parquet file or a datasets dir (save_to_disk); a speculators-format dataset dir's Arrow rows are read as they
    # are (hidden states are not read). null: rows sampled as data.synth says
    path: str | None = None
    synth: SynthConfig = field(default_factory=SynthConfig)   # only without data.path

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        self.synth.check()
        if self.path is None:
            _require(self.format == RowFormat.auto, "data.format",
                     f"describes data.path's rows, and there is no data.path (rows are sampled from the verifier): "
                     f"drop data.format={self.format.value}, or give data.path")
            _require(self.max_records is None, "data.max_records",
                     "bounds the records read from data.path, and there is no data.path (rows are sampled from the "
                     "verifier; data.synth.num_samples says how many): drop data.max_records, or give data.path")
            _require(self.max_chars is None, "data.max_chars",
                     "selects conversations read from data.path, and there is no data.path (rows are sampled from "
                     "the verifier): drop data.max_chars, or give data.path")
            return
        changed = [f"data.synth.{k}" for k, v in vars(self.synth).items() if v != getattr(SynthConfig(), k)]
        _require(not changed, changed[0] if changed else "data.synth",
                 f"describes the rows data=online samples without a data.path, and data.path={self.path} gives the "
                 f"rows: drop the data.synth override, or data.path to sample rows")
        if dataset_required:
            self._check_path(Path(self.path))

    def _check_path(self, p: Path) -> None:
        # Under on_bad_sample=skip a bad first line is a counted skip like any other, not a wrong file.
        problem = rows_path_problem(p, first_line=self.on_bad_sample == BadSamplePolicy.error)
        _require(problem is None, "data.path",
                 f"{self.path} {problem}; data=online reads token rows: {ROWS_FILES} (a speculators-format dataset "
                 f"dir's Arrow rows are read as they are; its hidden states are not read)")


class RegenerationEngine(str, Enum):
    auto = "auto"                   # vllm when its engine environment is there, else transformers (the log says which)
    transformers = "transformers"   # the verifier in this process: transformers' batched, KV-cached generate
    vllm = "vllm"                   # the verifier served by vLLM (python -m eagle3.serve --install builds its venv)


@dataclass
class Regeneration:
    """How the responses are regenerated (the settings the cached rows are keyed by)."""

    temperature: float = 0.0     # 0: greedy; above: sampled at this temperature from the full distribution
    max_new_tokens: int = 256    # tokens per response at most (fewer where the verifier's positions end)
    seed: int = 0                # with the prompt's index, seeds each prompt's draws (temperature > 0)
    batch_size: int = 16         # prompts per batched generation, and per chunk saved (a stopped run resumes there)
    engine: RegenerationEngine = RegenerationEngine.auto

    def check(self) -> None:
        for key in ("max_new_tokens", "batch_size"):
            value = getattr(self, key)
            _require(value >= 1, f"data.regenerate.{key}", f"must be >= 1, got {value}")
        require_temperature("data.regenerate.temperature", self.temperature)


@dataclass
class RegenerateDataConfig(TokenRows):
    """Rows = each prompt of data.path (prompt ids, out of the loss) + the verifier's response (trained on)."""

    name: str = "regenerate"
    # The prompt set, in any file data=online reads: conversations ({"messages"}, ShareGPT's {"conversations"};
    # rendered with the verifier's chat template; every assistant turn, and a last user turn, is a response to
    # regenerate) or {"input_ids", "loss_mask"} rows (every span of loss mask 1 is a response to regenerate; the
    # tokens before it are its prompt)
    path: str = MISSING
    regenerate: Regeneration = field(default_factory=Regeneration)

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        self.regenerate.check()
        if dataset_required:
            problem = rows_path_problem(Path(self.path), self.on_bad_sample == BadSamplePolicy.error)
            _require(problem is None, "data.path", f"{self.path} {problem}; data=regenerate reads a prompt set: "
                                                   f"{ROWS_FILES}")


@dataclass
class TinyDataConfig(HiddenStateFiles):
    name: str = "tiny"
    synth: SynthConfig = field(default_factory=SynthConfig)

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        self.synth.check()

# The data sources' schemas by `data.name`; eagle3.data.sources.registry adds a new source's (add_data_schema).
DATA_SCHEMAS: dict[str, type[DataConfig]] = {
    "offline": OfflineDataConfig, "online": OnlineDataConfig, "regenerate": RegenerateDataConfig,
    "tiny": TinyDataConfig,
}


def add_data_schema(schema: type[DataConfig]) -> None:
    """Adds a source's schema under its default `name`, stored as `data/base_<name>` for its option file's defaults
    list (conf/data/<name>.yaml: `defaults: [base_<name>]`)."""
    name = schema.name
    assert isinstance(name, str), f"{schema.__name__} gives no default name"
    DATA_SCHEMAS[name] = schema
    ConfigStore.instance().store(group="data", name=f"base_{name}", node=schema)


def data_schema(name: object) -> type[DataConfig]:
    """The schema of the data source `name`; one ConfigError naming the known ones for another."""
    if not isinstance(name, str) or name not in DATA_SCHEMAS:
        raise ConfigError(f"data.name: {name!r} is no data source; known: {', '.join(sorted(DATA_SCHEMAS))}")
    return DATA_SCHEMAS[name]


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
    scheduler: Scheduler = Scheduler.cosine   # cosine | linear | constant (after warmup)
    # micro-batches per optimizer step on each rank; global batch in tokens = data.total_seq_len * grad_accum *
    # world size
    grad_accum: int = 1
    checkpoint_every: int | None = None   # optimizer steps between resumable `last` checkpoints; null = each epoch end
    eval_every: int | None = None   # optimizer steps between val passes (and `best` updates) besides epoch ends
    # steps in a row with a non-finite loss or gradient (skipped, not applied) before the run stops, saving
    # checkpoints/last
    max_skipped_steps: int = 10

    def check(self) -> None:
        _require(math.isfinite(self.lr) and self.lr > 0, "optim.lr", f"must be a positive number, got {self.lr}")
        _require(self.epochs >= 1, "optim.epochs", f"must be at least 1, got {self.epochs}")
        _require(self.max_steps is None or self.max_steps >= 0, "optim.max_steps", "must be null or >= 0")
        _require(0 <= self.warmup_ratio < 1, "optim.warmup_ratio", f"must be in [0, 1), got {self.warmup_ratio}")
        _require(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _require(self.grad_clip > 0, "optim.grad_clip", "must be > 0")
        _require(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), "optim.betas",
                 "must be two numbers in [0, 1)")
        _require(self.grad_accum >= 1, "optim.grad_accum", f"must be at least 1, got {self.grad_accum}")
        _require(self.max_skipped_steps >= 1, "optim.max_skipped_steps", "must be at least 1")
        for key in ("checkpoint_every", "eval_every"):
            every = getattr(self, key)
            _require(every is None or every >= 1, f"optim.{key}", "must be null or >= 1")


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
    # Elastic restarts are not offered: a restarted rank would build the draft anew, not resume it. Kept so that
    # a run dir's resolved_config.yaml (max_restarts: 0) still reads; a failed run continues with resume=.
    max_restarts: int = 0

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def check(self) -> None:
        _require(self.nproc_per_node >= 1, "distributed.nproc_per_node", "must be >= 1")
        memory = self.device_memory_gb
        _require(memory is None or (math.isfinite(memory) and memory > 0), "distributed.device_memory_gb",
                 f"must be null or a positive number of GB, got {memory}")
        _require(self.nnodes >= 1, "distributed.nnodes", "must be >= 1")
        _require(0 <= self.node_rank < self.nnodes, "distributed.node_rank",
                 f"must be in [0, distributed.nnodes={self.nnodes})")
        _require(self.nnodes == 1 or bool(self.rdzv_endpoint), "distributed.rdzv_endpoint",
                 "is required with more than one node: host:port of node 0, reachable from every node")
        _require(self.max_restarts == 0, "distributed.max_restarts",
                 "must be 0: a restarted rank would build the draft anew instead of resuming it, and train a second "
                 "history; after a failure continue the run from checkpoints/last with python launch.py "
                 "resume=<run dir>")


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
    (eagle3/eval). Only for verifiers that fit beside the draft; off by default. `python -m eagle3.eval.accept`
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
        """Its values' ranges; also what `python -m eagle3.eval.accept` checks its options with."""
        for key, low in (("k", 1), ("num_prompts", 1), ("every", 1)):
            value = getattr(self, key)
            _require(value >= low, f"eval.accept.{key}", f"must be >= {low}, got {value}")
        _require(self.max_new_tokens >= 2, "eval.accept.max_new_tokens",
                 f"must be >= 2 (the first token comes from the prompt's forward, without a draft), "
                 f"got {self.max_new_tokens}")
        require_temperature("eval.accept.temperature", self.temperature)

    def check(self, dist: DistributedConfig) -> None:
        # The verifier it needs always exists: ModelConfig.check requires model.verifier.path or .tiny.
        self.check_values()
        if not self.enabled:
            return
        _require(dist.strategy != Strategy.fsdp or dist.world_size == 1, "eval.accept.enabled",
                 "needs the whole draft in rank 0, and FSDP shards it; measure the saved checkpoint afterwards with "
                 "python -m eagle3.eval.accept --run <run dir>")
        if self.prompts is not None:
            problem = rows_path_problem(Path(self.prompts))  # its rows are read at the first val pass
            _require(problem is None, "eval.accept.prompts", f"{self.prompts} {problem}; expected {ROWS_FILES}")


@dataclass
class ServeEvalConfig:
    """At the end of a run, its checkpoints/best served by vLLM (python -m eagle3.serve RUN) on eval.accept's
    prompts, token budget and temperature; off by default."""

    enabled: bool = False
    # a list of k, one report each (serve_vllm_k<k>_t<T>.json); null: the checkpoint's (its ttt_steps)
    k: list[int] | None = None
    python: str | None = None      # the engine's interpreter; null: $EAGLE3_VLLM_PYTHON, else the --install venv

    def check_values(self) -> None:
        """Its values' ranges; also what `python -m eagle3.serve` checks its --k with."""
        _require(self.k is None or (len(self.k) > 0 and min(self.k) >= 1), "eval.serve.k",
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
            _require(value >= low, f"train.on_policy.{key}", f"must be >= {low}, got {value}")
        require_temperature("train.on_policy.temperature", self.temperature)
        _require(0 < self.mix <= 1, "train.on_policy.mix", f"is the rollouts' share of the loss, in (0, 1]; got "
                                                           f"{self.mix}")
        _require(not self.enabled or dist.strategy != Strategy.fsdp or dist.world_size == 1,
                 "train.on_policy.enabled", "runs the whole draft in each rank, and FSDP shards it; use "
                                            "distributed=ddp")


@dataclass
class LoopConfig:
    on_policy: OnPolicyConfig = field(default_factory=OnPolicyConfig)


@dataclass
class TrainConfig:
    """What Hydra composes (conf/train.yaml)."""

    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    init: InitConfig = MISSING
    optim: OptimConfig = MISSING
    distributed: DistributedConfig = MISSING
    logger: LoggerConfig = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    train: LoopConfig = field(default_factory=LoopConfig)   # what the loop does besides the data's steps
    seed: int = 0                   # seeds torch (draft init) and the training data order
    cache_dir: str = MISSING
    device: Device = Device.auto    # auto (cuda if present, else cpu) | cpu | cuda
    resume: str | None = None       # a run dir: continue that run in place from its checkpoints/last (no overrides)
    # true: print the run's memory (GiB per rank) and time plan and exit; builds nothing, writes no run dir; exit
    # status 0 if it fits, 3 if it does not, 1 for a refused config. A run always plans first and stops if it
    # cannot fit (eagle3/plan/memory.py)
    plan: bool = False
    # What the run returns to a sweeper (hydra/sweeper=optuna maximises it): tau_sim, the best val tau_sim; or
    # accept_len, the measured acceptance (tokens per verify step) of checkpoints/best: needs
    # eval.accept.enabled=true and eval.accept.every=1, so that the val pass that chose the best checkpoint measured it.
    objective: Objective = Objective.tau_sim

    def check(self, dataset_required: bool = True) -> None:
        """The checks a type cannot express, each raising ConfigError naming the key. `dataset_required=False`:
        data.path need not hold a dataset yet (DataConfig.check)."""
        self.optim.check()
        self.data.check(self, dataset_required)
        self.model.check()
        _require(0 <= self.seed < 2**63, "seed", f"must be in [0, 2**63), got {self.seed}")
        _require(not (self.device == "cpu" and self.distributed.backend == "nccl"), "distributed.backend",
                 "nccl runs on CUDA GPUs only, and device=cpu; use distributed.backend=auto (gloo on CPU)")
        self.distributed.check()
        self.eval.accept.check(self.distributed)
        self.eval.serve.check_values()  # P-EAGLE's rule for vLLM is the draft's (DraftConfig.check)
        self.train.on_policy.check(self.distributed)
        dflash = self.model.draft.kind == DraftKind.dflash
        _require(not (dflash and self.train.on_policy.enabled), "train.on_policy.enabled",
                 "on-policy rollouts train an EAGLE-3 chain (eagle3/decoding/rollout.py), not a DFlash block: drop it "
                 "for model.draft.kind=dflash")
        _require(not (dflash and self.init.name != "scratch"), "init.name",
                 f"init={self.init.name} reads EAGLE-3 and P-EAGLE checkpoints only; a DFlash draft starts from "
                 "init=scratch")
        accept = self.eval.accept
        # accept_len exists only where the val pass that chose the best checkpoint measured acceptance.
        _require(self.objective != Objective.accept_len or (accept.enabled and accept.every == 1), "objective",
                 "accept_len needs measured acceptance at every val pass: add eval.accept.enabled=true"
                 + ("" if accept.every == 1 else " and eval.accept.every=1") + ", or use objective=tau_sim")


@dataclass
class RunInfo:
    """What Hydra knows about the job besides its config; the launcher adds it as `run` to the resolved config."""

    dir: str = MISSING
    name: str = MISSING
    group: str = MISSING            # the wandb group: the sweep's for every job of a sweep
    choices: dict[str, str] = field(default_factory=dict)   # group -> option, e.g. {"optim": "tiny"}
    overrides: list[str] = field(default_factory=list)      # the command line's; a value set there is explicit


@dataclass
class RunConfig(TrainConfig):
    """The run config as a run dir holds it (resolved_config.yaml): the composed config plus `run`."""

    run: RunInfo = MISSING


def register_configs() -> None:
    # Sweep sub-dir names come from the overrides; `experiment=k2_to_k25/finetune` must not nest a directory.
    if not OmegaConf.has_resolver("dirname_safe"):
        OmegaConf.register_new_resolver("dirname_safe", lambda s: str(s).replace("/", "-"))
    cs = ConfigStore.instance()
    for schema in DATA_SCHEMAS.values():
        cs.store(group="data", name=f"base_{schema.name}", node=schema)
    cs.store(name="base_train", node=TrainConfig)
    cs.store(group="model", name="base_model", node=ModelConfig)
    cs.store(group="init", name="base_scratch", node=ScratchInitConfig)
    cs.store(group="init", name="base_pretrained", node=PretrainedInitConfig)
    cs.store(group="optim", name="base_optim", node=OptimConfig)
    cs.store(group="distributed", name="base_distributed", node=DistributedConfig)
    cs.store(group="logger", name="base_logger", node=LoggerConfig)


def run_config(plain: dict[str, Any], dataset_required: bool = True) -> RunConfig:
    """The typed, checked run config from its plain form: the resolved composition plus `run`, or a run dir's
    resolved_config.yaml (an old run dir goes through the same schemas and checks as a fresh run).
    `dataset_required=False` is for plan=true, which reads no data: data.path need only be a directory."""
    cfg = _typed(RunConfig, plain, dataset_required)
    assert isinstance(cfg, RunConfig)
    return cfg


def validate(plain: dict[str, Any], dataset_required: bool = True) -> TrainConfig:
    """The typed, checked composed config (no `run` part) from its plain, resolved form (`dataset_required`: as
    for run_config)."""
    return _typed(TrainConfig, plain, dataset_required)


def _typed(schema_type: type[TrainConfig], plain: dict[str, Any], dataset_required: bool = True) -> TrainConfig:
    # Merging into the schemas refuses a key none of them has, which composition lets through when it is added
    # with `+` (`+optim.lr_warmup=0.1`), and converts each value to its type; then every part's check() runs.
    init = plain.get("init")
    name = init.get("name") if isinstance(init, dict) else None
    if name not in INIT_SCHEMAS:
        raise ConfigError(f"init.name: {name!r} has no options schema; known: {', '.join(sorted(INIT_SCHEMAS))}")
    data = plain.get("data")
    schema = _schema(schema_type, INIT_SCHEMAS[name], data_schema(data.get("name") if isinstance(data, dict) else None))
    try:
        cfg = OmegaConf.to_object(OmegaConf.merge(schema, plain))  # merge copies the schema: it stays as built
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        reason = str(e).splitlines()[0]
        raise ConfigError(f"{key}: {reason}" if key else reason) from None
    assert isinstance(cfg, TrainConfig)
    cfg.check(dataset_required)
    return cfg


_SCHEMAS: dict[tuple[type, type, type], DictConfig] = {}


def _schema(schema_type: type[TrainConfig], init_schema: type, data_schema: type) -> DictConfig:
    """The structured config of `schema_type` with the given init and data schemas, built once per process."""
    key = (schema_type, init_schema, data_schema)
    if key not in _SCHEMAS:
        schema = OmegaConf.structured(schema_type)
        schema.init = OmegaConf.structured(init_schema)
        schema.data = OmegaConf.structured(data_schema)
        _SCHEMAS[key] = schema
    return _SCHEMAS[key]


def plain_config(cfg: TrainConfig) -> dict[str, Any]:
    """The plain form of a typed config (enums as their names), as resolved_config.yaml and wandb hold it."""
    plain = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    assert isinstance(plain, dict)
    return {str(k): v for k, v in plain.items()}


def lr_advice(optim: OptimConfig, init: InitConfig) -> tuple[str, bool]:
    """The lr next to the initializer's recommended range, and whether it lies outside it."""
    lr, (low, high) = optim.lr, init.recommended_lr
    outside = not low <= lr <= high
    text = f"optim.lr={lr:g}; init={init.name} recommends {low:g} .. {high:g}"
    if outside:
        text += (" (above: a pretrained drafter's representations are easily destroyed; a finetune lr should be "
                 "below the scratch lr)" if lr > high else " (below: training will barely move)")
    return text, outside


ROWS_FILES = ("a JSONL file or JSON array of {\"input_ids\", \"loss_mask\"}, {\"messages\"} or ShareGPT "
              "{\"conversations\"} rows, a Parquet file or a datasets dir (save_to_disk) of such rows")


def rows_path_problem(p: Path, first_line: bool = True) -> str | None:
    """Why `p` holds no data rows (eagle3.formats.row_files reads them), said after its name, judged by its first bytes
    (a binary file, an empty one, and with `first_line` text that opens neither a JSON object nor an array) or,
    for a Parquet file or a `datasets` dir, by their marks (PAR1 at both ends; *.arrow files); None when it looks
    like rows. The rows themselves are checked one by one when they are read."""
    import codecs

    if p.is_dir():
        if (p / "dataset_dict.json").is_file():  # a DatasetDict: one dir per split
            splits = sorted(d.name for d in p.iterdir() if d.is_dir())
            return (f"holds the splits {', '.join(splits)} (a datasets DatasetDict); give one split's dir, e.g. "
                    f"{p / (splits or ['train'])[0]}")
        return None if any(p.glob("*.arrow")) else "is a dir without Arrow rows (no *.arrow file)"
    if not p.is_file():
        return path_kind(p, "a regular file or a dataset dir")
    with open(p, "rb") as f:
        head = f.read(4096)
        if p.suffix.lower() == ".parquet":
            f.seek(max(0, p.stat().st_size - 4))
            ok = head[:4] == b"PAR1" and f.read(4) == b"PAR1" and len(head) > 8
            return None if ok else "is not a Parquet file (no PAR1 mark at its start and end)"
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head)  # a character cut at 4096 bytes is no error
    except UnicodeDecodeError:
        return "is not a JSONL file or JSON array (not UTF-8 text: a binary file? Parquet files end in .parquet)"
    text = text.removeprefix("\ufeff").lstrip()  # a byte order mark, as Windows tools write one, is read past
    if not text:
        return "is empty" if not head or len(head) < 4096 else "starts with 4096 bytes of whitespace"
    if first_line and not text.startswith(("{", "[")):
        return (f"is not a JSONL file or JSON array (its first line opens neither a JSON object nor an array: "
                f"{text.splitlines()[0][:40]!r})")
    return None


def path_kind(p: Path, wanted: str) -> str:
    """Why `p` is not `wanted` ("a directory", ...), said after its name: "does not exist", "is a FIFO (named pipe),
    not a directory", ... (the mode only: a FIFO is never opened, reading it would block)."""
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        return "is a symlink to nothing (its target does not exist)" if p.is_symlink() else "does not exist"
    except OSError as e:
        return f"cannot be looked at ({e.strerror})"
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")]
    return f"is {next((name for test, name in kinds if test(mode)), 'of an unknown kind')}, not {wanted}"


def require_dir(path: str, key: str, entries: list[str], what: str) -> None:
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"{key}: {path} {path_kind(p, 'a directory')}; expected {what}")
    missing = [e for e in entries if not (p / e).exists()]
    if missing:
        raise ConfigError(f"{key}: {path} has no {', '.join(missing)}; expected {what}")
