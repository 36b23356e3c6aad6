"""Building an EAGLE-3, P-EAGLE or DFlash draft from the run's `model.draft` config, with speculators' constructors."""

from __future__ import annotations

import functools

import torch

from eagle3.arch.draft import DFLASH_NON_CAUSAL, block_size, dflash_anchors, layer_config_kwargs, mask_token
from eagle3.arch.masks import use_broadcast_masks
from eagle3.arch.rope import Rope, rope_parameters
from eagle3.arch.ttt_attention import use_ttt_attention
from eagle3.config import DraftConfig, DraftKind, LayerType


def draft_layer_config(draft: DraftConfig, attn_impl: str):
    """The decoder config of the draft's layers, of its layer type (speculators calls it `verifier_config`, but
    it is the draft's)."""
    from transformers import LlamaConfig, Qwen3Config

    # DFlash's layers are speculators' Qwen3 DFlash layers whatever layer_type says.
    layer_type = LayerType.qwen3 if draft.kind == DraftKind.dflash else LayerType(draft.layer_type)
    config_class = {LayerType.llama: LlamaConfig, LayerType.qwen3: Qwen3Config}[layer_type]
    config = config_class(**layer_config_kwargs(draft), rope_parameters=rope_parameters(draft_rope(draft)))
    config._attn_implementation = attn_impl
    return config


def draft_rope(draft: DraftConfig) -> Rope:
    return Rope(draft.rope_theta, draft.rope_scaling, draft.partial_rotary_factor)


def draft_classes(kind: DraftKind | str):
    """(model class, config class) of a draft kind: speculators' Eagle3DraftModel, or PEagleDraft or DFlashDraft
    below."""
    from speculators.models.dflash import DFlashSpeculatorConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.models.peagle import PEagleSpeculatorConfig

    if DraftKind(kind) == DraftKind.peagle:
        return peagle_draft_class(), PEagleSpeculatorConfig
    if DraftKind(kind) == DraftKind.dflash:
        return dflash_draft_class(), DFlashSpeculatorConfig
    return Eagle3DraftModel, Eagle3SpeculatorConfig


def new_draft(draft: DraftConfig, flags: dict[str, bool], attn_impl: str, verifier_dir: str,
              t2d: torch.Tensor | None, d2t: torch.Tensor | None):
    """The draft as speculators builds one for training: embed_tokens from the verifier, lm_head = the
    verifier's lm_head rows of the draft vocabulary (frozen), the rest freshly initialized (P-EAGLE: its
    embedding trained, its mask token and k = ttt_steps in its config; DFlash: DFLASH_NON_CAUSAL stated, so that
    vLLM runs its block non-causally, as it trains)."""
    model_class, _ = draft_classes(draft.kind)
    if draft.kind == DraftKind.dflash:
        return with_own_attention(model_class.from_training_args(
            verifier_config=draft_layer_config(draft, attn_impl), t2d=t2d, d2t=d2t,
            verifier_name_or_path=verifier_dir, target_layer_ids=list(draft.aux_layer_ids),
            draft_vocab_size=draft.draft_vocab_size, block_size=block_size(draft), mask_token_id=mask_token(draft),
            draft_attn_impl=attn_impl, trust_remote_code=False, **{DFLASH_NON_CAUSAL: True}), draft.kind)
    peagle = draft.kind == DraftKind.peagle
    extra = {"mask_token_id": mask_token(draft), "num_depths": draft.ttt_steps} if peagle else {}
    return with_own_attention(model_class.from_training_args(
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
    ), draft.kind)


def with_own_attention(model, kind: DraftKind | str):
    """A draft as speculators built it, with eagle3's attention paths: the TTT attention on CPU
    (eagle3.arch.ttt_attention; not DFlash's, which has no TTT steps) and dense masks built by broadcasting
    (eagle3.arch.masks); every draft eagle3 builds or loads gets them."""
    return use_broadcast_masks(model if DraftKind(kind) == DraftKind.dflash else use_ttt_attention(model))


def meta_draft(draft: DraftConfig, flags: dict[str, bool]):
    """The draft at full size on the meta device: shapes and parameter counts without allocating weights."""
    return bare_draft(draft, flags, "meta")


def bare_draft(draft: DraftConfig, flags: dict[str, bool], device: str | torch.device, attn_impl: str = "sdpa"):
    """The draft with no verifier attached: embed_tokens and the heads are left for the caller to fill."""
    from speculators import SpeculatorsConfig, VerifierConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig

    model_class, config_class = draft_classes(draft.kind)
    extra: dict = {"mask_token_id": mask_token(draft)} if draft.kind != DraftKind.eagle3 else {}
    if draft.kind == DraftKind.dflash:
        extra.update(aux_hidden_state_layer_ids=list(draft.aux_layer_ids), block_size=block_size(draft),
                     **{DFLASH_NON_CAUSAL: True})
    else:
        extra.update(eagle_aux_hidden_state_layer_ids=list(draft.aux_layer_ids), **flags)
    config = config_class(
        transformer_layer_config=draft_layer_config(draft, attn_impl),
        draft_vocab_size=draft.draft_vocab_size,
        speculators_config=SpeculatorsConfig(
            algorithm=DraftKind(draft.kind).value, default_proposal_method="greedy",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=draft.ttt_steps)],
            verifier=VerifierConfig(name_or_path=None, architectures=["LlamaForCausalLM"])),
        **extra,
    )
    with torch.device(device):
        model = model_class(config)
        return with_own_attention(model, draft.kind)


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


@functools.cache
def dflash_draft_class():
    """speculators' DFlashDraftModel as the loop calls a draft: the loop's EAGLE-3-shifted micro-batch is put back
    in DFlash's own alignment (`unshifted`), then speculators' anchor sampling, block mask and forward
    (`_backbone_forward`) and its loss and metrics (`compute_metrics`) run as they are, with
    dflash_anchors(block, packed length) anchors. Added: the chain counts `full_acc_<j>` (the share of blocks
    whose draft tokens 1..j+1 all match the verifier, so tau_sim = 1 + their sum = speculators' eal, the
    teacher-forced expected accepted length per block) and its loss as loss_0 (weighted by blocks in the val
    pass); its overall accuracy is `block_acc`. The val pass samples the same anchors every time, from its own
    seed, leaving the training RNG as it was."""
    from speculators.models.dflash import DFlashDraftModel
    from speculators.models.dflash.metrics import compute_metrics

    class DFlashDraft(DFlashDraftModel):
        def forward(self, hidden_states: torch.Tensor, input_ids: torch.Tensor, loss_mask: torch.Tensor,
                    verifier_last_hidden_states: torch.Tensor, document_ids: torch.Tensor,
                    position_ids: torch.Tensor | None = None, ttt_steps: int = 3, ttt_step_loss_decay: float = 1.0,
                    loss_config=None, **kwargs):
            batch = unshifted(input_ids, loss_mask, verifier_last_hidden_states, document_ids, position_ids)
            anchors = dflash_anchors(self.block_size, input_ids.shape[1])
            device = hidden_states.device
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else [], enabled=not self.training):
                if not self.training:
                    torch.manual_seed(0)
                _, logits, targets, mask, _ = self._backbone_forward(hidden_states, **batch, max_anchors=anchors)
            loss, metrics = compute_metrics(logits, targets, mask, self.block_size, loss_config=loss_config,
                                            sample_from_anchor=self.config.sample_from_anchor)
            return None, loss, dflash_metric_names(metrics, block_chain_counts(logits, targets, mask, self.block_size))

    # Saved checkpoints name the class speculators would write (save_pretrained records the class name).
    DFlashDraft.__name__ = DFlashDraft.__qualname__ = DFlashDraftModel.__name__
    return DFlashDraft


def unshifted(input_ids: torch.Tensor, loss_mask: torch.Tensor, last: torch.Tensor, document_ids: torch.Tensor,
              position_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The loop's micro-batch (speculators' shift_batch: position i of a document holds token i+1, its loss mask,
    the verifier's last state at i+1 and position i+1, beside aux state i) in DFlash's alignment, where
    position i holds token i, its loss mask, last state i and position i beside aux state i: the token-side
    tensors move one place right within each document. A document's first place has no token (speculators'
    shift dropped it): loss 0, so no anchor starts there, token 0 and last state 0, which nothing reads (no
    anchor before it). Its last token (and label) falls off the end."""
    if position_ids is None:
        raise ValueError("a DFlash micro-batch needs its position_ids (1 at each document's first place)")
    first = position_ids == 1  # shift_batch numbers a document's places from 1
    ids = input_ids.roll(1, dims=1).masked_fill(first, 0)
    mask = loss_mask.roll(1, dims=1).masked_fill(first, 0)
    last = last.roll(1, dims=1).masked_fill(first.unsqueeze(-1), 0.0)
    return {"input_ids": ids, "loss_mask": mask, "verifier_last_hidden_states": last,
            "document_ids": document_ids, "position_ids": (position_ids - 1).clamp(min=0)}


def block_chain_counts(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                       block: int) -> dict[str, torch.Tensor]:
    """full_acc_<j>_sum/_total of a DFlash forward: blocks whose draft slots 1..j+1 all match the verifier's argmax
    (and are trained), over blocks with any trained slot, as speculators' compute_accepted_length_counts forms
    its runs (so 1 + the sum over j of the ratios is its eal)."""
    correct = (logits.argmax(-1) == targets.argmax(-1)).reshape(-1, block)[:, 1:]
    valid = mask.to(torch.bool).reshape(-1, block)[:, 1:]
    runs = (correct & valid).to(torch.float32).cumprod(dim=-1)
    blocks = valid.any(dim=-1).to(torch.float32)
    out = {}
    for j in range(block - 1):
        out[f"full_acc_{j}_sum"], out[f"full_acc_{j}_total"] = (runs[:, j] * blocks).sum(), blocks.sum()
    return out


def dflash_metric_names(metrics: dict[str, torch.Tensor], chain: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {key: v for key, v in metrics.items() if not key.startswith("full_acc")}
    out["block_acc_sum"], out["block_acc_total"] = metrics["full_acc_sum"], metrics["full_acc_total"]
    out["loss_0_sum"], out["loss_0_total"] = metrics["loss_sum"], metrics["loss_total"]
    return {**out, **chain}
