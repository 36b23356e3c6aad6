"""Building an EAGLE-3 draft from the run's `model.draft` config, with speculators' own constructors."""

from __future__ import annotations

import torch

from eagle3.config import DraftConfig
from eagle3.rope import Rope, rope_parameters

# speculators' training defaults for a fresh EAGLE-3 draft (its `speculators train` flags).
SPECULATORS_FLAGS = {"norm_before_residual": True, "norm_before_fc": True, "norm_output": True, "fc_norm": False}
FLAGS = tuple(SPECULATORS_FLAGS)


def draft_layer_config(draft: DraftConfig, attn_impl: str):
    """The 1-layer Llama decoder config of the draft (speculators calls it `verifier_config`, but it is the draft's)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=draft.vocab_size,
        hidden_size=draft.hidden_size,
        intermediate_size=draft.intermediate_size,
        num_hidden_layers=1,
        num_attention_heads=draft.num_attention_heads,
        num_key_value_heads=draft.num_key_value_heads,
        head_dim=draft.head_dim,
        max_position_embeddings=draft.max_position_embeddings,
        rope_parameters=rope_parameters(draft_rope(draft)),
        rms_norm_eps=draft.rms_norm_eps,
        hidden_act=draft.hidden_act,
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn_impl
    return config


def draft_rope(draft: DraftConfig) -> Rope:
    return Rope(draft.rope_theta, draft.rope_scaling, draft.partial_rotary_factor)


def run_flags(draft: DraftConfig) -> dict[str, bool | None]:
    """The norm flags as the run's config sets them (None: as the initializer says)."""
    return {k: getattr(draft, k) for k in FLAGS}


def resolved_flags(draft: DraftConfig, defaults: dict[str, bool]) -> dict[str, bool]:
    """The norm flags of the draft: the run's value where it sets one, else `defaults` (the init's)."""
    return {k: defaults[k] if v is None else v for k, v in run_flags(draft).items()}


def new_draft(draft: DraftConfig, flags: dict[str, bool], attn_impl: str, verifier_dir: str,
              t2d: torch.Tensor | None, d2t: torch.Tensor | None):
    """An Eagle3DraftModel as speculators builds one for training: embed_tokens from the verifier, lm_head =
    the verifier's lm_head rows of the draft vocabulary (frozen), the rest freshly initialized."""
    from speculators.models.eagle3 import Eagle3DraftModel

    return Eagle3DraftModel.from_training_args(
        verifier_config=draft_layer_config(draft, attn_impl),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=verifier_dir,
        target_layer_ids=list(draft.aux_layer_ids),
        draft_vocab_size=draft.draft_vocab_size,
        ttt_steps=draft.ttt_steps,
        draft_attn_impl=attn_impl,
        trust_remote_code=False,  # the verifier's config is read by transformers' own classes, never its dir's code
        **flags,
    )


def meta_draft(draft: DraftConfig, flags: dict[str, bool]):
    """The draft at full size on the meta device: shapes and parameter counts without allocating weights."""
    return bare_draft(draft, flags, "meta")


def bare_draft(draft: DraftConfig, flags: dict[str, bool], device: str | torch.device, attn_impl: str = "sdpa"):
    """The draft with no verifier attached: embed_tokens and the heads are left for the caller to fill."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    config = Eagle3SpeculatorConfig(
        transformer_layer_config=draft_layer_config(draft, attn_impl),
        draft_vocab_size=draft.draft_vocab_size,
        eagle_aux_hidden_state_layer_ids=list(draft.aux_layer_ids),
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3", default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=draft.ttt_steps)],
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])),
        **flags,
    )
    with torch.device(device):
        return Eagle3DraftModel(config)
