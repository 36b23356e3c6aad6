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

DFlash (`model.draft.kind=dflash`, speculators' models/dflash, vLLM's `method: dflash`) drafts a block of
block_size = ttt_steps + 1 tokens in one non-causal forward: the last verified token (the anchor) and ttt_steps
mask tokens, each attending to the whole block and to fc over the verifier's aux states of every position before
the anchor (those keys and values come from the verifier's states, not from the draft's own tokens). Its layers
are speculators' Qwen3DFlashDecoderLayer (q/k norms; `layer_type` is not read); embed_tokens and lm_head are the
verifier's, frozen. It trains on anchor blocks sampled over the sequence (speculators' select_anchors: at most
DFLASH_MAX_ANCHORS, here as many as fill the packed length once).

This module imports neither torch nor speculators: the plan and `launch.py --cfg job` read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eagle3.config import SPECULATORS_FLAGS, DraftKind, LayerType, asked_flags

if TYPE_CHECKING:
    from eagle3.config import DraftConfig


# speculators' COD sampling defaults (PEagleDraftModel.forward): depth d trains on max(RATIO**d, RATIO_MIN) of the
# positions.
COD_RATIO, COD_RATIO_MIN = 0.7, 0.2


# speculators' DFlash default (DFlashDraftModel.get_trainer_kwargs' max_anchors): anchor blocks per micro-batch.
DFLASH_MAX_ANCHORS = 512

# What a DFlash checkpoint states so that vLLM runs its block non-causally, as it trains. speculators reads
# sliding_window_non_causal for sliding-window layers only (full attention is always bidirectional) and these drafts
# have none, so it changes nothing in training or the harness; vLLM's speculators reader (0.32) makes it every
# layer's causality (dflash_config.causal = not the flag), so speculators' default, false, runs the block causally
# there (docs/serving.md#dflash).
DFLASH_NON_CAUSAL = "sliding_window_non_causal"


def dflash_engine_causal(config: Any) -> bool:
    """Whether vLLM runs the block of a DFlash checkpoint whose parsed config.json is `config` causally: when it
    does not state DFLASH_NON_CAUSAL true (vllm's update_dflash: causal = not the flag, absent read as true)."""
    return isinstance(config, dict) and config.get(DFLASH_NON_CAUSAL, True) is not True


def has_sliding_layers(config: Any) -> bool:
    """Whether a draft checkpoint's parsed config.json states sliding-window layers in its
    transformer_layer_config (layer_types)."""
    layers = config.get("transformer_layer_config") if isinstance(config, dict) else None
    return isinstance(layers, dict) and "sliding_attention" in (layers.get("layer_types") or [])


def block_size(draft: DraftConfig) -> int:
    """DFlash's tokens per block: the anchor (the last verified token) and ttt_steps draft tokens."""
    return draft.ttt_steps + 1


def dflash_anchors(block: int, total_seq_len: int) -> int:
    """Anchor blocks one DFlash training forward runs: as many as fill the packed length once (block tokens
    each), at most speculators' DFLASH_MAX_ANCHORS, at least one."""
    return max(1, min(DFLASH_MAX_ANCHORS, total_seq_len // block))


def mask_token(draft: DraftConfig) -> int:
    """The token id P-EAGLE's masked slots read: model.draft.mask_token_id, else the verifier vocabulary's last."""
    return draft.vocab_size - 1 if draft.mask_token_id is None else draft.mask_token_id


def sampled_share(draft: DraftConfig) -> float:
    """Tokens one training forward runs through the decoder, per sequence position: k for EAGLE-3 (its TTT
    steps), sum over depths of COD's kept share for P-EAGLE (one forward over all the sampled positions)."""
    if draft.kind == DraftKind.eagle3:
        return float(draft.ttt_steps)
    if draft.kind == DraftKind.dflash:  # dflash_anchors blocks fill the packed length about once
        return 1.0
    return sum(max(COD_RATIO ** d, COD_RATIO_MIN) for d in range(draft.ttt_steps))


def resolved_flags(draft: DraftConfig, init_defaults: dict[str, bool]) -> dict[str, bool]:
    """The norm flags of the draft: what the run asks for, else the initializer's `init_defaults`."""
    return {k: init_defaults[k] if v is None else v for k, v in asked_flags(draft).items()}


def structure(draft: DraftConfig) -> dict[str, object]:
    """The decoder's structure as a checkpoint's transformer_layer_config states it."""
    layer_type = LayerType.qwen3 if draft.kind == DraftKind.dflash else LayerType(draft.layer_type)
    return {"model_type": layer_type.value, "num_hidden_layers": draft.num_layers}


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


def parameter_counts(draft: DraftConfig, train_lm_head: bool = False) -> dict[str, tuple[int, bool]]:
    """{tensor group: (elements, trainable)} of the Eagle3DraftModel speculators builds for `draft` from scratch
    (the flags it leaves null: speculators' defaults)."""
    if draft.kind == DraftKind.dflash:
        return dflash_parameter_counts(draft)
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


def dflash_parameter_counts(draft: DraftConfig) -> dict[str, tuple[int, bool]]:
    """{tensor group: (elements, trainable)} of speculators' DFlashDraftModel for `draft`: Qwen3 DFlash layers
    whose q/k/v read H-wide inputs (the block's and fc's), fc with its hidden_norm, the verifier's embedding and
    heads frozen."""
    h, n_aux, n = draft.hidden_size, len(draft.aux_layer_ids), draft.num_layers
    q, kv = draft.num_attention_heads * draft.head_dim, draft.num_key_value_heads * draft.head_dim
    return {
        "embed_tokens (verifier's, frozen)": (draft.vocab_size * h, False),
        "lm_head (draft vocab, verifier's, frozen)": (draft.draft_vocab_size * h, False),
        "verifier_lm_head (targets, frozen)": (draft.draft_vocab_size * h, False),
        "verifier_norm (frozen)": (h, False),
        "fc (aux hidden states -> H)": (n_aux * h * h, True),
        "decoder layers: attention": (n * (h * q + 2 * h * kv + q * h), True),
        "decoder layers: MLP": (n * 3 * h * draft.intermediate_size, True),
        # Per layer: input and post-attention norms, q_norm and k_norm over one head; fc's hidden_norm; the final norm.
        "norms": (n * (2 * h + 2 * draft.head_dim) + 2 * h, True),
    }


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


def draft_kind_of(config: Any) -> str:
    """The draft kind (eagle3.config.DraftKind) a draft checkpoint's parsed config states by its
    speculators_model_type (eagle3 when it states none, or is not a JSON object: the config class's own reading
    says what is wrong with it). The config is read by eagle3.init.checkpoint.draft_kind."""
    kind = config.get("speculators_model_type", "eagle3") if isinstance(config, dict) else "eagle3"
    return kind if kind in (DraftKind.peagle.value, DraftKind.dflash.value) else DraftKind.eagle3.value
