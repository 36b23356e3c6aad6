"""Building an EAGLE-3 or P-EAGLE draft from the run's `model.draft` config, with speculators' own constructors."""

from __future__ import annotations

import functools

import torch

from eagle3.arch.draft import layer_config_kwargs, mask_token
from eagle3.arch.rope import Rope, rope_parameters
from eagle3.arch.ttt_attention import use_ttt_attention
from eagle3.config import DraftConfig, DraftKind, LayerType


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


def draft_classes(kind: DraftKind | str):
    """(model class, config class) of a draft kind: speculators' Eagle3DraftModel, or PEagleDraft below."""
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.models.peagle import PEagleSpeculatorConfig

    if DraftKind(kind) == DraftKind.peagle:
        return peagle_draft_class(), PEagleSpeculatorConfig
    return Eagle3DraftModel, Eagle3SpeculatorConfig


def new_draft(draft: DraftConfig, flags: dict[str, bool], attn_impl: str, verifier_dir: str,
              t2d: torch.Tensor | None, d2t: torch.Tensor | None):
    """The draft as speculators builds one for training: embed_tokens from the verifier, lm_head = the
    verifier's lm_head rows of the draft vocabulary (frozen), the rest freshly initialized (P-EAGLE: its
    embedding trained, its mask token and k = ttt_steps in its config)."""
    model_class, _ = draft_classes(draft.kind)
    peagle = draft.kind == DraftKind.peagle
    extra = {"mask_token_id": mask_token(draft), "num_depths": draft.ttt_steps} if peagle else {}
    return use_ttt_attention(model_class.from_training_args(
        verifier_config=draft_layer_config(draft, attn_impl),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=verifier_dir,
        target_layer_ids=list(draft.aux_layer_ids),
        draft_vocab_size=draft.draft_vocab_size,
        ttt_steps=draft.ttt_steps,
        draft_attn_impl=attn_impl,
        trust_remote_code=False,  # the verifier's config is read by transformers' own classes, never its dir's code
        **extra,
        **flags,
    ))


def meta_draft(draft: DraftConfig, flags: dict[str, bool]):
    """The draft at full size on the meta device: shapes and parameter counts without allocating weights."""
    return bare_draft(draft, flags, "meta")


def bare_draft(draft: DraftConfig, flags: dict[str, bool], device: str | torch.device, attn_impl: str = "sdpa"):
    """The draft with no verifier attached: embed_tokens and the heads are left for the caller to fill."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    model_class, config_class = draft_classes(draft.kind)
    extra = {"mask_token_id": mask_token(draft)} if draft.kind == DraftKind.peagle else {}
    config = config_class(
        transformer_layer_config=draft_layer_config(draft, attn_impl),
        draft_vocab_size=draft.draft_vocab_size,
        eagle_aux_hidden_state_layer_ids=list(draft.aux_layer_ids),
        speculators_config=SpeculatorsConfig(
            algorithm=DraftKind(draft.kind).value, default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=draft.ttt_steps)],
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])),
        **extra,
        **flags,
    )
    with torch.device(device):
        return use_ttt_attention(model_class(config))


@functools.cache
def peagle_draft_class():
    """speculators' PEagleDraftModel as the loop calls a draft: `ttt_steps` is its number of depths (k), its
    per-depth accuracies are named as EAGLE-3's steps (full_acc_<d>, so tau_sim = 1 + their sum) and its loss
    also as loss_0 (weighted by depth 0's positions in the val pass); the val pass samples the same positions
    every time, from its own seed, leaving the training RNG as it was."""
    from speculators.models.peagle import PEagleDraftModel

    class PEagleDraft(PEagleDraftModel):
        def forward(self, *args, ttt_steps: int = 3, ttt_step_loss_decay: float = 1.0, **kwargs):
            if self.training:
                out = super().forward(*args, num_depths=ttt_steps, **kwargs)
            else:
                device = kwargs["hidden_states"].device
                with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                    torch.manual_seed(0)
                    out = super().forward(*args, num_depths=ttt_steps, **kwargs)
            draft_tokens, loss, metrics = out
            return draft_tokens, loss, eagle3_metric_names(metrics, ttt_steps)

    # Saved checkpoints name the class speculators would write (save_pretrained records the class name).
    PEagleDraft.__name__ = PEagleDraft.__qualname__ = PEagleDraftModel.__name__
    return PEagleDraft


def eagle3_metric_names(metrics: dict[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    out = {key: v for key, v in metrics.items() if not key.startswith(("full_acc_", "position_"))}
    for d in range(k):
        for part in ("sum", "total"):
            out[f"full_acc_{d}_{part}"] = metrics[f"position_{d}_acc_{part}"]
    out["loss_0_sum"], out["loss_0_total"] = metrics["loss_sum"], metrics["loss_total"]
    return out
