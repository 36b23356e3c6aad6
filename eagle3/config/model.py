"""The model part's schemas: the verifier (a local dir or a tiny one built from a seed) and the draft, with the rules
of their flags and shapes that the config check, the initializers, the verifier's reader and export all apply: the
norm flags (speculators' defaults, EAGLE-3.1's, what a draft kind can be served with) and the sizes no decoder
could have."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from omegaconf import MISSING

from eagle3.config.checks import require, require_dir


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
        require((self.path is None) != (self.tiny is None), "model.verifier",
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
            require(not problems, "model.verifier.tiny", "a verifier no model could have: " + problems.replace(
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
        require(not problems, "model.draft", f"a draft no model could have: {'; '.join(problems)}")
        for key in ("rope_theta", "rms_norm_eps"):
            value = getattr(self, key)
            require(math.isfinite(value) and value > 0, f"model.draft.{key}", f"must be positive, got {value}")
        require(self.ttt_steps >= 1, "model.draft.ttt_steps", "must be >= 1")
        require(self.num_layers >= 1, "model.draft.num_layers", f"must be >= 1, got {self.num_layers}")
        conflicts = flag_conflicts(self)
        require(not conflicts, "model.draft", "; ".join(conflicts))
        unservable = kind_flag_problem(self.kind, asked_flags(self))
        require(unservable is None, "model.draft.kind",
                f"peagle with EAGLE-3.1's norms (eagle31=true or fc_norm=true) trains a draft no engine serves as "
                f"trained ({unservable}; export refuses it): drop model.draft.eagle31/fc_norm to train P-EAGLE, or "
                f"train EAGLE-3.1 with model.draft.kind=eagle3")
        if self.kind == DraftKind.peagle:
            require(self.ttt_step_loss_decay == 1.0, "model.draft.ttt_step_loss_decay",
                    "P-EAGLE weighs its depths as speculators' PEagleDraftModel does (equally); leave it at 1.0")
        require(self.mask_token_id is None or self.kind != DraftKind.eagle3, "model.draft.mask_token_id",
                f"is the input token of P-EAGLE's or DFlash's masked slots, and model.draft.kind="
                f"{self.kind.value} has none: drop it, or set model.draft.kind=peagle or dflash")
        self._check_dflash()
        require(self.mask_token_id is None or 0 <= self.mask_token_id < self.vocab_size, "model.draft.mask_token_id",
                f"must be a token id in [0, model.draft.vocab_size={self.vocab_size}), got {self.mask_token_id}")
        require(0 < self.draft_vocab_size <= self.vocab_size, "model.draft.draft_vocab_size",
                f"must be in (0, model.draft.vocab_size={self.vocab_size}]")
        ids = list(self.aux_layer_ids)
        require(len(ids) > 0, "model.draft.aux_layer_ids", "must name at least one verifier layer")
        require(len(set(ids)) == len(ids), "model.draft.aux_layer_ids",
                f"{ids} names a layer twice; each aux layer feeds the draft once")
        require(min(ids) >= 0, "model.draft.aux_layer_ids", f"{ids}: layer ids are >= 0")
        require(self.partial_rotary_factor == 1.0, "model.draft.partial_rotary_factor",
                f"is {self.partial_rotary_factor} (model=auto: the verifier's), but the draft's Llama layer rotates "
                "whole heads (transformers' default Llama RoPE has no partial rotation, vLLM and SGLang would "
                "rotate a share): set model.draft.partial_rotary_factor=1.0 to train a draft that rotates whole "
                "heads, as speculators' own trainer does; the export states it, so engines rotate as it was trained")
        require(self.rope_scaling is None or (isinstance(self.rope_scaling, dict)
                                             and isinstance(self.rope_scaling.get("rope_type"), str)),
                "model.draft.rope_scaling", "names its rope_type (llama3, yarn, linear, ...), or is null")

    def _check_dflash(self) -> None:
        """kind=dflash's own keys, and the EAGLE-3 keys it has no use for, refused when set."""
        if self.kind != DraftKind.dflash:
            require(self.block_size is None, "model.draft.block_size",
                    f"is DFlash's block, and model.draft.kind={self.kind.value} drafts no blocks: drop it, or set "
                    f"model.draft.kind=dflash")
            return
        lo, hi = DFLASH_BLOCK_RANGE
        require(lo <= self.ttt_steps + 1 <= hi, "model.draft.ttt_steps",
                f"is {self.ttt_steps}: a DFlash block of ttt_steps + 1 tokens must hold {lo} to {hi} tokens")
        require(self.block_size is None or lo <= self.block_size <= hi, "model.draft.block_size",
                f"must be in [{lo}, {hi}] (the last verified token and 1 to {hi - 1} draft tokens), got "
                f"{self.block_size}")
        require(self.block_size is None or self.block_size == self.ttt_steps + 1, "model.draft.block_size",
                f"is {self.block_size}, which drafts {self.block_size - 1 if self.block_size else 0} tokens per "
                f"verify step, but model.draft.ttt_steps={self.ttt_steps}: set model.draft.ttt_steps="
                f"{(self.block_size or 1) - 1} too, or leave block_size null (ttt_steps + 1)")
        set_flags = [k for k, v in run_flags(self).items() if v is not None] + (["eagle31"] if self.eagle31 else [])
        require(not set_flags, "model.draft.kind",
                f"dflash has none of EAGLE-3's norm flags ({', '.join(set_flags)} set): drop them")
        require(self.ttt_step_loss_decay == 1.0, "model.draft.ttt_step_loss_decay",
                "DFlash weighs its block positions by speculators' own decay (exp(-(j-1)/4)); leave it at 1.0")
        require(not self.gradient_checkpointing, "model.draft.gradient_checkpointing",
                "is not supported for kind=dflash (its activations are one block pass, see the plan)")


@dataclass
class ModelConfig:
    name: str = MISSING
    verifier: VerifierConfig = field(default_factory=VerifierConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)

    def check(self) -> None:
        # Both set: a model option with its own tiny verifier (model=tiny) got a path; its draft is sized after
        # the tiny one, so training against the path would not fit. Said before verifier.check's generic message.
        require(self.verifier.path is None or self.verifier.tiny is None, "model.verifier.path",
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
    require(max(ids) < depth, "model.draft.aux_layer_ids",
            f"{list(ids)} goes beyond the verifier's {depth} decoder layers: ids are in [0, {depth - 1}] "
            f"(hidden_states[i] enters layer i); [2, N//2, N-3] is the usual choice, here {usual}")
