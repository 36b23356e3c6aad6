"""On-policy rollouts of the draft (Draft-OPD, arXiv 2605.29343): the current draft and the verifier run speculative
decoding (the KV-cached harness of eagle3/decoding/drafting.py), and every verify round becomes a training row that
the draft learns from with the offline loss.

A round after the verified tokens x_0..x_m proposed d_1..d_k: the draft's step 0 at index m-1 (on the verifier's aux
states of the prefix, token x_m, position m) and its steps 1..k-1 at that index (on its own hidden state and own
token d_j, position m+j), exactly as `DraftChain.propose` computes them. The verify forward scored every drafted
position conditioned on the drafted tokens: its logits at positions m..m+k-1 (restricted to the draft vocabulary,
as the offline targets `verifier_lm_head(verifier_norm(.))` are) are the soft targets of steps 0..k-1, accepted
and rejected positions alike.

Row format: one `Rollout` per prompt holds the verified sequence, the aux states of all its positions but the last
(one plain verifier forward over it, as training data is written: a causal verifier's states of an accepted prefix
do not depend on what follows) and per round the index of its chain, its k draft tokens and k target rows. All
rounds of a prompt share the prefix, so `unrolled_logits` recomputes them in one differentiable pass: step 0 over
every index (the keys every chain attends to), then each step j >= 1 only at the rounds' indices, each attending
to step 0's keys up to its index and to its own chain (speculators' diagonal blocks).

Gradients: through every unrolled step (step j's input hidden state is step j-1's output, not detached) and through
step 0's keys of the prefix. Only what is discrete or the verifier's is constant: the drafted tokens (sampled or
argmax at rollout time) and the aux states and targets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from eagle3.decoding.drafting import (
    Sampling,
    _draft_step,
    _new_cache,
    fc_input,
    prefix_mask,
    speculative_decode,
    verifier_pass,
)
from eagle3.errors import ConfigError


@dataclass
class Rollout:
    """One prompt's speculative decoding as training rows (see the module doc)."""

    ids: list[int]              # the verified tokens every round's prefix is a start of
    aux: torch.Tensor           # [len(ids) - 1, n_aux * H]: the verifier's aux states of each position but the last
    ends: list[int] = field(default_factory=list)              # round r's chain index m_r - 1
    drafts: list[list[int]] = field(default_factory=list)      # round r's k draft tokens (target vocabulary)
    targets: list[torch.Tensor] = field(default_factory=list)  # round r's [k, draft vocab] verifier logits
    accepted: list[int] = field(default_factory=list)          # draft tokens round r's verify step accepted


def check_attention(draft: torch.nn.Module) -> None:
    """The unrolled pass builds dense masks; flex attention takes a BlockMask."""
    if draft._attn_impl not in ("sdpa", "eager"):
        raise ConfigError(f"train.on_policy: the draft's attention is {draft._attn_impl}; on-policy rows are trained "
                          f"with dense masks: set model.draft.attn_impl=sdpa (or eager)")


@torch.no_grad()
def rollout(verifier: torch.nn.Module, draft: torch.nn.Module, prompt: Sequence[int], k: int, max_new_tokens: int,
            aux_layer_ids: Sequence[int], sampling: Sampling) -> Rollout:
    """Speculative decoding of `prompt` with the draft as it is (the cached harness, k tokens per round), recorded
    round by round."""
    rounds: list[tuple[int, list[int], torch.Tensor, int]] = []
    keep = draft_vocab_rows(draft)
    decode = speculative_decode(verifier, draft, prompt, k, max_new_tokens, aux_layer_ids, sampling, cached=True,
                                on_round=lambda m, d, logits, n: rounds.append((m, list(d), logits[:k, keep], n)))
    ids = list(prompt) + decode.tokens
    ids = ids[:rounds[-1][0] + 1]  # the last round's prefix: later tokens are in no row
    aux = verifier_pass(verifier, ids, aux_layer_ids).aux[:len(ids) - 1]
    return Rollout(ids, aux, [m - 1 for m, *_ in rounds], [d for _, d, _, _ in rounds],
                   [t.to(aux.device) for _, _, t, _ in rounds], [n for *_, n in rounds])


def draft_vocab_rows(draft: torch.nn.Module) -> torch.Tensor | slice:
    """Which verifier-vocabulary columns the draft vocabulary holds, in its order (t2d; all without a mapping)."""
    return slice(None) if draft.t2d is None else draft.t2d.cpu().nonzero().flatten()


def unrolled_logits(draft: torch.nn.Module, row: Rollout) -> torch.Tensor:
    """[rounds, k, draft vocab]: the draft's logits of each round's k steps, recomputed with gradients in one pass
    over the prefix (module doc)."""
    device = draft.fc.weight.device
    length = len(row.ids) - 1
    ends = torch.tensor(row.ends, device=device)
    drafts = torch.tensor(row.drafts, device=device)  # [R, k]
    rounds, k = drafts.shape
    cache = _new_cache()
    hidden = fc_input(draft, row.aux)
    mask = prefix_mask(draft, length, device)
    hidden, logits = _draft_step(draft, torch.tensor([row.ids[1:]], device=device), hidden,
                                 torch.arange(1, length + 1, device=device).unsqueeze(0), mask, cache,
                                 torch.arange(length, device=device), last_only=False)
    steps = [logits[ends]]
    hidden, mask = hidden[:, ends], mask[:, :, ends]
    for j in range(1, k):
        from speculators.models.eagle3.attention import extend_dense_mask_for_draft_tokens

        mask = extend_dense_mask_for_draft_tokens(mask, rounds)
        start = length + (j - 1) * rounds
        # The draft embeds verifier-vocabulary ids (its embed_tokens is the verifier's), as the harness feeds them.
        hidden, logits = _draft_step(draft, drafts[:, j - 1].unsqueeze(0), hidden,
                                     (ends + 1 + j).unsqueeze(0), mask, cache,
                                     torch.arange(start, start + rounds, device=device), last_only=False)
        steps.append(logits)
    return torch.stack(steps, dim=1)


def rollout_loss(draft: torch.nn.Module, rows: Sequence[Rollout], loss_config: Any,
                 ttt_step_loss_decay: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The offline loss (speculators' `compound_loss` with its per-step decay: the sum over steps of each step's
    mean over positions) over every round of `rows`, and counted metrics: rollout_loss, rollout_accept_len (tokens
    per verify step, the bonus token included) and rollout_acc_<j> (step j's argmax equals the target's)."""
    from speculators.losses import compound_loss, exp_loss_decay

    logits = torch.cat([unrolled_logits(draft, row) for row in rows])                       # [R, k, V]
    targets = torch.cat([torch.stack(row.targets) for row in rows]).to(logits.device)      # [R, k, V]
    rounds, k = logits.shape[:2]
    device = logits.device
    ones = torch.ones(1, rounds, dtype=torch.bool, device=device)
    loss = torch.zeros((), device=device)
    metrics: dict[str, torch.Tensor] = {}
    count = partial(torch.tensor, dtype=torch.float64, device=device)
    for j in range(k):
        # Contiguous rows in one dtype, as the fused (Triton) loss reads them; offline targets are also computed
        # under the training autocast.
        step = compound_loss(logits[None, :, j].contiguous(), targets[None, :, j].to(logits.dtype).contiguous(), ones,
                             torch.full((1, rounds), j, device=device), loss_config,
                             partial(exp_loss_decay, gamma=ttt_step_loss_decay))[0]
        loss = loss + step
        metrics[f"rollout_acc_{j}_sum"] = (logits[:, j].argmax(-1) == targets[:, j].argmax(-1)).sum().double()
        metrics[f"rollout_acc_{j}_total"] = count(rounds)
    metrics["rollout_loss_sum"] = loss.detach().double()
    metrics["rollout_loss_total"] = count(1)
    metrics["rollout_accept_len_sum"] = count(sum(sum(n + 1 for n in row.accepted) for row in rows))
    metrics["rollout_accept_len_total"] = count(rounds)
    return loss, metrics
