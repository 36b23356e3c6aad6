"""Building an EAGLE-3 draft from the run's `model.draft` config, with speculators' own constructors."""

from __future__ import annotations

import torch

from eagle3.config import DraftConfig
from eagle3.draft_arch import LayerType, layer_config_kwargs
from eagle3.rope import Rope, rope_parameters


def draft_layer_config(draft: DraftConfig, attn_impl: str):
    """The decoder config of the draft's layers, of its layer type (speculators calls it `verifier_config`, but
    it is the draft's)."""
    from transformers import LlamaConfig, Qwen3Config

    config_class = {LayerType.llama: LlamaConfig, LayerType.qwen3: Qwen3Config}[LayerType(draft.layer_type)]
    config = config_class(**layer_config_kwargs(draft), rope_parameters=rope_parameters(draft_rope(draft)))
    config._attn_implementation = attn_impl
    return config


def draft_rope(draft: DraftConfig) -> Rope:
    return Rope(draft.rope_theta, draft.rope_scaling, draft.partial_rotary_factor)


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
