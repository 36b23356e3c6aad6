"""Chain speculative decoding with a Hugging Face verifier and an EAGLE-3 draft, as a serving engine runs it.

Everything is recomputed over the whole prefix at every step (no KV cache across steps): slower than a
serving engine, but each number comes from one plain forward, and the verifier's plain greedy decoding
below goes through the same call, so the two agree up to the shape of the forward (see `greedy_decode`).

Alignment (speculators' `shift_batch` + `Eagle3DraftModel.forward`): the draft at index t reads the
verifier's aux hidden states of position t and the embedding of token t+1, sits at position t+1, and
predicts token t+2. So with verified tokens x_0..x_m (x_m, the verifier's last greedy token, not yet run
through the verifier) and aux states g_0..g_{m-1}, TTT step 0 at index m-1 proposes x_{m+1}; step j > 0
feeds the draft's own hidden state of step j-1 at that index with its own token of step j-1 at position
m+j, and attends to step 0's keys of the prefix plus the keys of its own chain (the diagonal blocks of
speculators' training mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from eagle3.config import ConfigError


@dataclass
class VerifierPass:
    """One verifier forward over a sequence of T tokens."""

    logits: torch.Tensor  # [T, V]: position t scores token t+1
    aux: torch.Tensor     # [T, n_aux * H]: output_hidden_states[i] for the aux ids, concatenated in their order
    last: torch.Tensor    # [T, H]: the last decoder layer's output before the final norm


@torch.no_grad()
def verifier_pass(verifier: torch.nn.Module, ids: Sequence[int], aux_layer_ids: Sequence[int]) -> VerifierPass:
    """Logits and hidden states exactly as eagle3/data/prepare.py writes them for training: the aux slots are
    Hugging Face `output_hidden_states[i]` (the residual stream entering layer i, what vLLM captures), the
    last slot the final layer's output before the final norm (speculators applies the verifier norm itself)."""
    from eagle3.data.prepare import pre_final_norm

    device = next(verifier.parameters()).device
    with pre_final_norm(verifier) as pre_norm:
        out = verifier(input_ids=torch.tensor([list(ids)], device=device), output_hidden_states=True)
    aux = torch.cat([out.hidden_states[i][0] for i in aux_layer_ids], dim=-1)
    return VerifierPass(logits=out.logits[0].float(), aux=aux.float(), last=pre_norm[-1][0].float())


def check_draft(draft: torch.nn.Module) -> None:
    """The chain below mirrors a full-attention draft; a sliding window would need its mask rebuilt."""
    if draft.uses_sliding_window_attn:
        raise ConfigError("drafts with sliding-window attention layers are not supported by the acceptance "
                          "measurement (its chain steps attend to the whole prefix)")


@torch.no_grad()
def propose(draft: torch.nn.Module, ids: Sequence[int], aux: torch.Tensor, k: int) -> tuple[list[int], list[torch.Tensor]]:
    """The draft's greedy chain of `k` tokens after `ids` (target-vocabulary ids), and its logits per step
    (draft vocabulary). `aux` holds the verifier's aux states of every position of `ids` but the last."""
    m = len(ids) - 1
    if aux.shape[0] != m:
        raise ValueError(f"aux states cover {aux.shape[0]} positions, expected {m} (all tokens but the last)")
    device = draft.fc.weight.device
    dtype = draft.fc.weight.dtype
    hidden = aux.to(device, dtype).unsqueeze(0)
    if draft.input_norm is not None:  # config.norm_before_fc
        hidden = draft.input_norm(hidden)
    if draft.fc_norm is not None:     # config.fc_norm
        hidden = torch.cat([norm(c) for norm, c in zip(draft.fc_norm, hidden.chunk(len(draft.fc_norm), dim=-1))], -1)
    hidden = draft.fc(hidden)

    # Step 0 over the whole prefix: the keys the chain attends to.
    token_ids = torch.tensor([list(ids[1:])], device=device)
    positions = torch.arange(1, m + 1, device=device).unsqueeze(0)
    mask = prefix_mask(draft, m, device)
    cache = _new_cache()
    hidden, logits = _draft_step(draft, token_ids, hidden, positions, mask, cache,
                                 torch.arange(m, device=device))
    proposals, step_logits = [], []
    for j in range(k):
        step_logits.append(logits)
        token = to_target_id(draft, int(logits.argmax()))
        proposals.append(token)
        if j == k - 1:
            break
        # Step j+1 at the last index: the draft's own token and hidden state, one position further; its only
        # query sees the whole cache (prefix keys + its chain), so no mask is needed.
        hidden, logits = _draft_step(draft, torch.tensor([[token]], device=device), hidden,
                                     torch.tensor([[m + j + 1]], device=device), None, cache,
                                     torch.tensor([m + j], device=device))
    return proposals, step_logits


def prefix_mask(draft: torch.nn.Module, m: int, device: torch.device):
    """Step 0's attention mask over one sequence of `m` positions, as `Eagle3DraftModel.forward` builds it for a
    single document (causal; its diagonal term adds nothing at step 0). The dense masks are built directly:
    speculators' vmap-based builder costs more than the draft step itself on a small model."""
    if draft._attn_impl == "simple_flex_attention":  # a BlockMask
        return draft._build_attn_mask(torch.zeros(m, dtype=torch.long, device=device), m, device)
    causal = torch.ones(m, m, dtype=torch.bool, device=device).tril()[None, None]
    if draft._attn_impl != "eager":
        return causal
    # eager adds the mask to the scores: 0 where attended, -inf elsewhere, in speculators' dtype (bf16).
    return torch.zeros(causal.shape, dtype=torch.bfloat16, device=device).masked_fill_(~causal, float("-inf"))


def _new_cache():
    from transformers import DynamicCache

    return DynamicCache()


def _draft_step(draft: torch.nn.Module, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                mask, cache, cache_position: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One TTT step of `Eagle3DraftModel.forward`, line for line: embed, concat, rotary, layers, norm, head.
    Returns, at the last position only (the chain's), the hidden state fed to the next step (normed when
    config.norm_output) and the draft logits."""
    embeds = draft.embed_tokens(token_ids)
    hidden = torch.cat([embeds, hidden], dim=-1)
    position_embeddings = draft.rotary_emb(hidden, positions)
    for layer in draft.layers:
        hidden = layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       cache_position=cache_position, position_embeddings=position_embeddings)
    hidden = hidden[:, -1:]
    if draft.config.norm_output:
        hidden = draft.norm(hidden)
        return hidden, draft.lm_head(hidden)[0, -1]
    return hidden, draft.lm_head(draft.norm(hidden))[0, -1]


def to_target_id(draft: torch.nn.Module, draft_id: int) -> int:
    """Draft vocabulary id -> verifier id: target = i + d2t[i] (no d2t when the vocabularies are the same)."""
    return draft_id if draft.d2t is None else draft_id + int(draft.d2t[draft_id])


@dataclass
class Decode:
    """One prompt's speculative decoding."""

    tokens: list[int]                                  # the continuation, max_new_tokens long
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted at each verify step (0..k)


@torch.no_grad()
def speculative_decode(verifier: torch.nn.Module, draft: torch.nn.Module, prompt: Sequence[int], k: int,
                       max_new_tokens: int, aux_layer_ids: Sequence[int]) -> Decode:
    """Greedy chain speculative decoding: the verifier's forward over the prompt gives the first token and the
    aux states; then each step the draft proposes `k` tokens, one verifier forward scores all of them, the
    longest prefix equal to the verifier's greedy tokens is kept plus the verifier's next token (the bonus).

    Every step proposes all `k` tokens, also near the end; the continuation is cut to `max_new_tokens`
    afterwards, while `accepted` counts what each verify step accepted."""
    ids = list(prompt)
    first = verifier_pass(verifier, ids, aux_layer_ids)
    aux = first.aux
    ids.append(int(first.logits[-1].argmax()))
    accepted = []
    while len(ids) - len(prompt) < max_new_tokens:
        drafts, _ = propose(draft, ids, aux, k)
        checked = verifier_pass(verifier, ids + drafts, aux_layer_ids)
        m = len(ids) - 1
        greedy = checked.logits[m:].argmax(-1).tolist()  # the verifier's token after x_m, after d_1, ... d_k
        n = 0
        while n < k and drafts[n] == greedy[n]:
            n += 1
        ids += drafts[:n] + [greedy[n]]
        # The verifier's states of the accepted tokens are exact: a causal model's position t never sees later ones.
        aux = checked.aux[:m + n + 1]
        accepted.append(n)
    return Decode(tokens=ids[len(prompt):len(prompt) + max_new_tokens], accepted=accepted)


@torch.no_grad()
def greedy_decode(verifier: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int) -> list[int]:
    """The verifier's plain greedy decoding, by the same full-sequence forward as the speculative loop (fp32, no
    cache). The speculative loop reads position m of a longer sequence where this reads the last position of a
    sequence ending at m: equal in exact arithmetic, and in fp32 up to rounding that could only flip an exact
    near-tie (which `first_difference` reports as such)."""
    ids = list(prompt)
    for _ in range(max_new_tokens):
        ids.append(int(next_token_logits(verifier, ids).argmax()))
    return ids[len(prompt):]


@torch.no_grad()
def next_token_logits(verifier: torch.nn.Module, ids: Sequence[int]) -> torch.Tensor:
    device = next(verifier.parameters()).device
    return verifier(input_ids=torch.tensor([list(ids)], device=device)).logits[0, -1].float()
