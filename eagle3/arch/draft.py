"""The draft's architecture, defined once: its decoder layers (how many, of which type), its norm flags, its
tensors and their sizes, and the per-token activation terms of one test-time-training step.

Build (eagle3/init/build.py), the plan (eagle3/plan/memory.py), gradient checkpointing
(eagle3/arch/activation_checkpointing.py, which patches every layer of `model.layers`), the harness
(eagle3/decoding/drafting.py, which runs every layer of `draft.layers`), export and the pretrained initializer read
the draft's structure from here, or from the model speculators builds from `layer_config_kwargs`; none of them
spells out a layer by hand.

speculators 0.9 builds the layers (models/eagle3/core.py): layer 0 is the EAGLE-3 first layer (q/k/v take the
2H-wide [embedding, hidden] input, plus a hidden_norm), layers 1.. are plain decoder layers of the same type
(`model_classes[transformer_layer_config.model_type]`: llama or qwen3; a Qwen3 layer adds RMSNorms over each
query and key head). EAGLE-3.1 (speculators PR #610) is the same class with per-aux `fc_norm` instead of the one
`norm_before_fc`, and `norm_output`.

P-EAGLE (`model.draft.kind=peagle`, speculators' models/peagle, vLLM's parallel drafting) is the same decoder with
a trainable embedding and one learned `mask_hidden` (n_aux x H, in place of the aux states): it proposes all k
tokens in one forward, the first after the last verified token, the other k-1 at `mask_token_id` inputs. It trains
on COD-sampled positions (speculators' generate_cod_sample_indices: depth d keeps a share max(0.7^d, 0.2) of the
positions) instead of k test-time-training steps over every position.

This module imports neither torch nor speculators: the plan and `launch.py --cfg job` read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagle3.config import DraftConfig


class LayerType(str, Enum):
    """The draft's decoder layer: transformers' model_type, as speculators and vLLM read it."""

    llama = "llama"
    qwen3 = "qwen3"


class DraftKind(str, Enum):
    """How the draft proposes k tokens: eagle3, one forward per token (k TTT steps in training); peagle, all k in
    one forward (P-EAGLE)."""

    eagle3 = "eagle3"
    peagle = "peagle"


# speculators' COD sampling defaults (PEagleDraftModel.forward): depth d trains on max(RATIO**d, RATIO_MIN) of the
# positions.
COD_RATIO, COD_RATIO_MIN = 0.7, 0.2


def mask_token(draft: DraftConfig) -> int:
    """The token id P-EAGLE's masked slots read: model.draft.mask_token_id, else the verifier vocabulary's last."""
    return draft.vocab_size - 1 if draft.mask_token_id is None else draft.mask_token_id


def sampled_share(draft: DraftConfig) -> float:
    """Tokens one training forward runs through the decoder, per sequence position: k for EAGLE-3 (its TTT
    steps), sum over depths of COD's kept share for P-EAGLE (one forward over all the sampled positions)."""
    if draft.kind == DraftKind.eagle3:
        return float(draft.ttt_steps)
    return sum(max(COD_RATIO ** d, COD_RATIO_MIN) for d in range(draft.ttt_steps))


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


def resolved_flags(draft: DraftConfig, init_defaults: dict[str, bool]) -> dict[str, bool]:
    """The norm flags of the draft: what the run asks for, else the initializer's `init_defaults`."""
    return {k: init_defaults[k] if v is None else v for k, v in asked_flags(draft).items()}


def structure(draft: DraftConfig) -> dict[str, object]:
    """The decoder's structure as a checkpoint's transformer_layer_config states it."""
    return {"model_type": LayerType(draft.layer_type).value, "num_hidden_layers": draft.num_layers}


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


def layer_config_kwargs(draft: DraftConfig) -> dict:
    """The keyword arguments of the draft's decoder config (transformers' LlamaConfig or Qwen3Config, by
    `layer_type`), all but the RoPE and the attention implementation, which build.py adds."""
    return dict(
        vocab_size=draft.vocab_size,
        hidden_size=draft.hidden_size,
        intermediate_size=draft.intermediate_size,
        num_hidden_layers=draft.num_layers,
        num_attention_heads=draft.num_attention_heads,
        num_key_value_heads=draft.num_key_value_heads,
        head_dim=draft.head_dim,
        max_position_embeddings=draft.max_position_embeddings,
        rms_norm_eps=draft.rms_norm_eps,
        hidden_act=draft.hidden_act,
        tie_word_embeddings=False,
    )


def layer_names(num_layers: int) -> list[str]:
    """The state-dict prefix of each decoder layer (speculators' `layers.{i}.`)."""
    return [f"layers.{i}." for i in range(num_layers)]


def parameter_counts(draft: DraftConfig, train_lm_head: bool = False) -> dict[str, tuple[int, bool]]:
    """{tensor group: (elements, trainable)} of the Eagle3DraftModel speculators builds for `draft` from scratch
    (the flags it leaves null: speculators' defaults)."""
    flags = resolved_flags(draft, SPECULATORS_FLAGS)
    h, n_aux, n = draft.hidden_size, len(draft.aux_layer_ids), draft.num_layers
    q, kv = draft.num_attention_heads * draft.head_dim, draft.num_key_value_heads * draft.head_dim
    # q/k/v of layer 0 take the concatenated [embedding, hidden] input (2H wide); the later layers' take H.
    attention = (2 * h * q + 2 * 2 * h * kv + q * h) + (n - 1) * (h * q + 2 * h * kv + q * h)
    # Per layer: input_layernorm, post_attention_layernorm (+ layer 0's hidden_norm; + a Qwen3 layer's q_norm and
    # k_norm over one head each); the final norm.
    qk_norms = 2 * draft.head_dim if draft.layer_type == LayerType.qwen3 else 0
    norms = h + n * (2 * h + qk_norms) + h
    norms += (n_aux * h if flags["norm_before_fc"] else 0) + (n_aux * h if flags["fc_norm"] else 0)
    peagle = draft.kind == DraftKind.peagle
    counts = {
        # P-EAGLE trains its embedding (PEagleSpeculatorConfig.embed_requires_grad): the mask token's row is learned.
        "embed_tokens (verifier's, frozen)": (draft.vocab_size * h, False),
        "lm_head (draft vocab)": (draft.draft_vocab_size * h, train_lm_head),
        "verifier_lm_head (targets, frozen)": (draft.draft_vocab_size * h, False),
        "verifier_norm (frozen)": (h, False),
        "fc (aux hidden states -> H)": (n_aux * h * h, True),
        "decoder layers: attention": (attention, True),
        "decoder layers: MLP": (n * 3 * h * draft.intermediate_size, True),
        "norms": (norms, True),
    }
    if peagle:
        counts["embed_tokens (verifier's, trained)"] = counts.pop("embed_tokens (verifier's, frozen)")[0], True
        counts["mask_hidden (masked slots' aux states)"] = (n_aux * h, True)
    return counts


def layer_weights(draft: DraftConfig) -> int:
    """Elements of the decoder layers' matrices (attention and MLP), for the FLOP count."""
    counts = parameter_counts(draft)
    return counts["decoder layers: attention"][0] + counts["decoder layers: MLP"][0]


def layer_step_elements(draft: DraftConfig, compute: int, norm: int, layers: int | None = None) -> int:
    """Bytes per token that autograd keeps for one TTT step through all decoder layers, without the cache and the
    attention score terms; `compute` is the compute dtype's size, `norm` a norm's saved bytes per element;
    `layers`: the first that many layers only (default all).

    Layer 0: its [embedding, hidden] input (2H, held by the norms' views) and the normed concat q/k/v read (2H);
    the two input norms' normed halves (2H of norm bytes, their inputs counted twice); q after rotary and the
    attention output twice (3 x heads*head_dim, the o_proj input is a contiguous copy); the post-attention
    residual and its normed (2H); the MLP's input (H); the MLP's gate, up, act and product (4I). A later layer:
    its input and normed (H each, the norm's), q/attention 3 x heads*head_dim, the residual, its normed and the
    MLP input (3H), 4I. A Qwen3 layer also keeps q and k before and after their per-head norms.
    """
    h, qd, kvd, inter = (draft.hidden_size, draft.num_attention_heads * draft.head_dim,
                         draft.num_key_value_heads * draft.head_dim, draft.intermediate_size)
    first = (4 * h + 3 * qd + 2 * h + 4 * inter) * compute + 4 * h * norm
    later = (3 * qd + 3 * h + 4 * inter) * compute + 2 * h * norm
    qk = (qd + kvd) * norm if draft.layer_type == LayerType.qwen3 else 0
    n = draft.num_layers if layers is None else layers
    return first + (n - 1) * later + n * qk
