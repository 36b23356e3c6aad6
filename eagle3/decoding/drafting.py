"""Chain speculative decoding with a Hugging Face verifier and an EAGLE-3 draft, as a serving engine runs it.

Two harnesses make the same decisions: the uncached one recomputes everything over the whole prefix at every
step (each number from one plain forward); the cached one keeps the verifier's KV cache (Hugging Face's
DynamicCache, cropped to the accepted prefix after each verify step) and the draft's step-0 keys of the prefix,
so each step runs the verifier over k+1 new tokens and the draft over the newly accepted ones, as an engine
does. At temperature 0 both accept the longest prefix equal to the verifier's greedy tokens; at T > 0 they
run standard speculative sampling (`verify`), which leaves the verifier's sampling distribution unchanged.

Alignment (speculators' `shift_batch` + `Eagle3DraftModel.forward`): the draft at index t reads the
verifier's aux hidden states of position t and the embedding of token t+1, sits at position t+1, and
predicts token t+2. So with verified tokens x_0..x_m (x_m, the verifier's last greedy token, not yet run
through the verifier) and aux states g_0..g_{m-1}, TTT step 0 at index m-1 proposes x_{m+1}; step j > 0
feeds the draft's own hidden state of step j-1 at that index with its own token of step j-1 at position
m+j, and attends to step 0's keys of the prefix plus the keys of its own chain (the diagonal blocks of
speculators' training mask).

A DFlash draft (speculators' DFlashDraftModel) proposes its k <= block_size - 1 tokens from one forward of the
block [x_m, mask, ..., mask] at positions m..m+block_size-1, attending to the whole block and to fc over g_0..g_{m-1}
(speculators' anchor-block mask for one document with the anchor at m); block slot j proposes x_{m+j}. The slots
do not read each other's drafts, so at T > 0 each token is drawn from its slot's q and speculative sampling stays
lossless.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from eagle3.config import require_temperature
from eagle3.errors import ConfigError


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
    from eagle3.verifier.forward import hidden_state_taps

    device = next(verifier.parameters()).device
    with hidden_state_taps(verifier, aux_layer_ids) as taps:
        out = verifier(input_ids=torch.tensor([list(ids)], device=device))
    aux = torch.cat([taps[k][0] for k in range(len(aux_layer_ids))], dim=-1)
    return VerifierPass(logits=out.logits[0].float(), aux=aux.float(), last=taps["last"][0].float())


def check_draft(draft: torch.nn.Module) -> None:
    """The chain below mirrors a full-attention draft; a sliding window would need its mask rebuilt."""
    if draft.uses_sliding_window_attn:
        raise ConfigError("drafts with sliding-window attention layers are not supported by the acceptance "
                          "measurement (its chain steps attend to the whole prefix)")


@dataclass
class Sampling:
    """How tokens are chosen: greedy at temperature 0, else drawn at `temperature` from a seeded torch.Generator
    (on the CPU, so that a seed gives the same draws on any device)."""

    temperature: float = 0.0
    seed: int = 0
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self):
        require_temperature("temperature", self.temperature)
        if self.generator is None and self.temperature > 0:
            self.generator = torch.Generator().manual_seed(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits / T) in fp32 on the CPU, over the last dim."""
        return torch.softmax(logits.detach().float().cpu() / self.temperature, dim=-1)

    def draw(self, probs: torch.Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))


GREEDY = Sampling()


def draft_probs(draft: torch.nn.Module, logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """The draft's q at T over the TARGET vocabulary: draft id i carries target id i + d2t[i]; target tokens
    outside the draft vocabulary get q = 0 (the draft can never propose them)."""
    q = sampling.probs(logits)
    if draft.d2t is None:
        return q
    full = torch.zeros(draft.t2d.shape[0], dtype=q.dtype)
    full[torch.arange(q.shape[0]) + draft.d2t.cpu()] = q
    return full


def accept_draft_token(p: torch.Tensor, q: torch.Tensor, token: int, sampling: Sampling) -> bool:
    """Speculative sampling's test: accept `token` (drawn from q) with probability min(1, p(token) / q(token))."""
    return sampling.uniform() * float(q[token]) < float(p[token])


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)): what a rejected position samples from, so that accept + resample gives p."""
    r = (p - q).clamp_(min=0)
    total = float(r.sum())
    return r / total if total > 0 else p  # p == q up to rounding: rejection had probability ~0


def verify(drafts: Sequence[int], verifier_logits: torch.Tensor, draft_q: Sequence[torch.Tensor] | None,
           sampling: Sampling, accept_rule=accept_draft_token) -> tuple[int, int]:
    """One verify step: (draft tokens accepted, the verifier's next token). `verifier_logits[j]` scores the
    token after draft j (row 0: after the last verified token). Greedy: the longest prefix equal to the
    verifier's argmax, then its argmax. Sampled: each draft token in turn passes `accept_rule` (speculative
    sampling's min(1, p/q) test) or is replaced by a draw from normalize(max(0, p - q)), which ends the step; a
    fully accepted chain gets a bonus token drawn from p. `accept_rule` is a parameter only so that a test can
    show a wrong rule is caught."""
    k = len(drafts)
    if sampling.greedy:
        greedy = verifier_logits.argmax(-1).tolist()
        n = 0
        while n < k and drafts[n] == greedy[n]:
            n += 1
        return n, greedy[n]
    assert draft_q is not None, "speculative sampling needs the draft's distribution q of each draft token"
    p = sampling.probs(verifier_logits)
    for j in range(k):
        if not accept_rule(p[j], draft_q[j], drafts[j], sampling):
            return j, sampling.draw(residual(p[j], draft_q[j]))
    return k, sampling.draw(p[k])


def choose(logits: torch.Tensor, sampling: Sampling) -> int:
    """The verifier's own next token: argmax at T = 0, else a draw from softmax(logits / T)."""
    return int(logits.argmax()) if sampling.greedy else sampling.draw(sampling.probs(logits))


class DraftChain:
    """The draft's side of decoding: proposes chains of k tokens after the verified tokens.

    Cached (sdpa or eager attention): the draft's step-0 keys and values of every verified index stay in a
    DynamicCache, so each proposal runs step 0 only over the indices added since the last one (those of the
    newly accepted tokens), then its k - 1 chain steps; the chain's entries are cropped off afterwards. A
    step-0 entry at index t depends only on aux state t, token t+1 and position t+1, all final once verified.
    Uncached (or flex attention, whose block mask is built for the whole prefix): step 0 over the whole prefix
    at every proposal, as `propose` has always done."""

    def __init__(self, draft: torch.nn.Module, cached: bool = True):
        self.draft = draft
        self.cached = cached and draft._attn_impl in ("sdpa", "eager")
        self.cache = _new_cache()
        self.length = 0  # indices whose step-0 entries are in the cache

    @torch.no_grad()
    def propose(self, ids: Sequence[int], aux: torch.Tensor, k: int,
                sampling: Sampling = GREEDY) -> tuple[list[int], list[torch.Tensor]]:
        """The draft's chain of `k` tokens after `ids` (target-vocabulary ids), and its logits per step (draft
        vocabulary). `aux` holds the verifier's aux states of every position of `ids` but the last."""
        draft = self.draft
        m = len(ids) - 1
        if aux.shape[0] != m:
            raise ValueError(f"aux states cover {aux.shape[0]} positions, expected {m} (all tokens but the last)")
        if is_block(draft):
            return propose_block(draft, ids, aux, k, sampling)
        if not self.cached or self.length >= m:
            self.cache, self.length = _new_cache(), 0
        start = self.length
        device = draft.fc.weight.device
        hidden = fc_input(draft, aux[start:])

        if is_parallel(draft):
            proposals, step_logits = self._propose_parallel(ids, hidden, start, k, sampling)
            crop_to(self.cache, m)
            return proposals, step_logits
        # Step 0 over the new indices (all of them when uncached): the keys the chain attends to.
        token_ids = torch.tensor([list(ids[start + 1:])], device=device)
        positions = torch.arange(start + 1, m + 1, device=device).unsqueeze(0)
        mask = prefix_mask(draft, m, device, start) if m - start > 1 or start == 0 else None
        hidden, logits = _draft_step(draft, token_ids, hidden, positions, mask, self.cache,
                                     torch.arange(start, m, device=device))
        self.length = m
        proposals, step_logits = [], []
        for j in range(k):
            step_logits.append(logits)
            if sampling.greedy:
                token = to_target_id(draft, int(logits.argmax()))
            else:
                token = sampling.draw(draft_probs(draft, logits, sampling))
            proposals.append(token)
            if j == k - 1:
                break
            # Step j+1 at the last index: the draft's own token and hidden state, one position further; its only
            # query sees the whole cache (prefix keys + its chain), so no mask is needed.
            hidden, logits = _draft_step(draft, torch.tensor([[token]], device=device), hidden,
                                         torch.tensor([[m + j + 1]], device=device), None, self.cache,
                                         torch.tensor([m + j], device=device))
        crop_to(self.cache, m)
        return proposals, step_logits

    def _propose_parallel(self, ids: Sequence[int], hidden: torch.Tensor, start: int, k: int,
                          sampling: Sampling) -> tuple[list[int], list[torch.Tensor]]:
        """P-EAGLE's one forward (vLLM's parallel drafting): the new indices as step 0 reads them, then k - 1
        masked slots (the mask token, fc over the learned mask_hidden) at the next positions; all causal, as
        speculators' P-EAGLE mask is for one anchor (its depth-d slot sees the prefix and the anchor's lower
        depths). Slot d's logits give draft token d; the tokens do not feed each other."""
        draft, m = self.draft, len(ids) - 1
        device = draft.fc.weight.device
        masked = fc_input(draft, draft.mask_hidden.reshape(1, -1).expand(k - 1, -1))
        hidden = torch.cat([hidden, masked], dim=1)
        token_ids = torch.tensor([list(ids[start + 1:]) + [draft.mask_token_id] * (k - 1)], device=device)
        end = m + k - 1  # indices start .. end-1 run
        positions = torch.arange(start + 1, end + 1, device=device).unsqueeze(0)
        mask = prefix_mask(draft, end, device, start) if end - start > 1 or start == 0 else None
        out = _decoder(draft, token_ids, hidden, positions, mask, self.cache, torch.arange(start, end, device=device))
        self.length = m
        logits = list(draft.lm_head(draft.norm(out[:, -k:]))[0])
        if sampling.greedy:
            return [to_target_id(draft, int(lg.argmax())) for lg in logits], logits
        return [sampling.draw(draft_probs(draft, lg, sampling)) for lg in logits], logits


def is_block(draft: torch.nn.Module) -> bool:
    """A DFlash draft (speculators' DFlashDraftModel): a block of tokens from one non-causal forward."""
    return getattr(draft.config, "speculators_model_type", None) == "dflash"


@torch.no_grad()
def propose_block(draft: torch.nn.Module, ids: Sequence[int], aux: torch.Tensor, k: int,
                  sampling: Sampling = GREEDY) -> tuple[list[int], list[torch.Tensor]]:
    """DFlash's `k` draft tokens after `ids` and their logits (draft vocabulary), from one forward of its block,
    line for line as `DFlashDraftModel._backbone_forward` runs one anchor's block (see the module doc); no mask:
    every query sees the whole context and block. Recomputed at every proposal (the context's keys are fc over
    the verifier's states, a cache would only save that)."""
    block, m = draft.block_size, len(ids) - 1
    if not 1 <= k <= block - 1:
        raise ConfigError(f"k={k}: a DFlash draft of block_size {block} proposes 1 to {block - 1} tokens per verify "
                          f"step")
    device, dtype = draft.fc.weight.device, draft.fc.weight.dtype
    context = draft.hidden_norm(draft.fc(aux.to(device, dtype).unsqueeze(0)))
    tokens = torch.tensor([[ids[-1]] + [draft.mask_token_id] * (block - 1)], device=device)
    hidden = draft.embed_tokens(tokens)
    positions = torch.arange(m + block, device=device).unsqueeze(0)
    position_embeddings = draft.rotary_emb(hidden, positions)
    for layer in draft.layers:
        hidden = layer(hidden_states=hidden, target_hidden=context, attention_mask=None, position_ids=positions,
                       use_cache=False, position_embeddings=position_embeddings)
    logits = list(draft.lm_head(draft.norm(hidden))[0, 1:k + 1])
    if sampling.greedy:
        return [to_target_id(draft, int(lg.argmax())) for lg in logits], logits
    return [sampling.draw(draft_probs(draft, lg, sampling)) for lg in logits], logits


def is_parallel(draft: torch.nn.Module) -> bool:
    """A P-EAGLE draft (speculators' PEagleDraftModel): all k tokens from one forward."""
    return hasattr(draft, "mask_hidden")


@torch.no_grad()
def propose(draft: torch.nn.Module, ids: Sequence[int], aux: torch.Tensor, k: int,
            sampling: Sampling = GREEDY) -> tuple[list[int], list[torch.Tensor]]:
    """The draft's chain of `k` tokens after `ids` with everything recomputed (see DraftChain.propose)."""
    return DraftChain(draft, cached=False).propose(ids, aux, k, sampling)


def fc_input(draft: torch.nn.Module, aux: torch.Tensor) -> torch.Tensor:
    """The draft's fc over the verifier's aux states (with its input norms), as its forward applies it."""
    hidden = aux.to(draft.fc.weight.device, draft.fc.weight.dtype).unsqueeze(0)
    if draft.input_norm is not None:  # config.norm_before_fc
        hidden = draft.input_norm(hidden)
    if draft.fc_norm is not None:     # config.fc_norm
        hidden = torch.cat([norm(c) for norm, c in zip(draft.fc_norm, hidden.chunk(len(draft.fc_norm), dim=-1))], -1)
    return draft.fc(hidden)


def crop_to(cache, length: int) -> None:
    """Keeps the first `length` positions of a DynamicCache (its crop takes the number to remove)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def prefix_mask(draft: torch.nn.Module, m: int, device: torch.device, start: int = 0):
    """Step 0's attention mask over one sequence of `m` positions, as `Eagle3DraftModel.forward` builds it for a
    single document (causal; its diagonal term adds nothing at step 0), for the queries `start`..m-1 (those not
    in the cache yet). The dense masks are built directly: speculators' vmap-based builder costs more than the
    draft step itself on a small model."""
    if draft._attn_impl == "simple_flex_attention":  # a BlockMask, always over the whole prefix
        return draft._build_attn_mask(torch.zeros(m, dtype=torch.long, device=device), m, device)
    causal = torch.ones(m, m, dtype=torch.bool, device=device).tril()[None, None, start:]
    if draft._attn_impl != "eager":
        return causal
    # eager adds the mask to the scores: 0 where attended, -inf elsewhere, in speculators' dtype (bf16).
    return torch.zeros(causal.shape, dtype=torch.bfloat16, device=device).masked_fill_(~causal, float("-inf"))


def _new_cache():
    from transformers import DynamicCache

    return DynamicCache()


def _draft_step(draft: torch.nn.Module, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
                mask, cache, cache_position: torch.Tensor,
                last_only: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """One TTT step of `Eagle3DraftModel.forward`, line for line: embed, concat, rotary, every decoder layer in turn
    (any number, of any type eagle3/arch/draft.py builds; each keeps its own cache entries), norm, head.
    Returns, at the last position only (the chain's), the hidden state fed to the next step (normed when
    config.norm_output) and the draft logits; with `last_only=False` those of every position ([1, T, H], [T, V])."""
    hidden = _decoder(draft, token_ids, hidden, positions, mask, cache, cache_position)
    if last_only:
        hidden = hidden[:, -1:]
    if draft.config.norm_output:
        hidden = draft.norm(hidden)
        logits = draft.lm_head(hidden)[0]
    else:
        logits = draft.lm_head(draft.norm(hidden))[0]
    return hidden, logits[-1] if last_only else logits


def _decoder(draft: torch.nn.Module, token_ids: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor,
             mask, cache, cache_position: torch.Tensor) -> torch.Tensor:
    """Embed, concat with the fc'd hidden states, rotary, every decoder layer in turn: the decoder's output."""
    hidden = torch.cat([draft.embed_tokens(token_ids), hidden], dim=-1)
    position_embeddings = draft.rotary_emb(hidden, positions)
    for layer in draft.layers:
        hidden = layer(hidden, attention_mask=mask, position_ids=positions, past_key_values=cache,
                       cache_position=cache_position, position_embeddings=position_embeddings)
    return hidden


def to_target_id(draft: torch.nn.Module, draft_id: int) -> int:
    """Draft vocabulary id -> verifier id: target = i + d2t[i] (no d2t when the vocabularies are the same)."""
    return draft_id if draft.d2t is None else draft_id + int(draft.d2t[draft_id])


@dataclass
class Decode:
    """One prompt's speculative decoding."""

    tokens: list[int]                                  # the continuation, max_new_tokens long
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted at each verify step (0..k)


class VerifierCache:
    """The verifier over a growing sequence through Hugging Face's DynamicCache: each forward runs only the new
    tokens; `crop` drops the entries of rejected draft tokens."""

    def __init__(self, verifier: torch.nn.Module, aux_layer_ids: Sequence[int] = ()):
        self.verifier, self.aux_layer_ids = verifier, list(aux_layer_ids)
        self.device = next(verifier.parameters()).device
        self.cache = _new_cache()

    @torch.no_grad()
    def forward(self, new_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [L, V] fp32, aux states [L, n_aux * H] fp32 or None without aux ids) of the L new tokens."""
        want_aux = bool(self.aux_layer_ids)
        out = self.verifier(input_ids=torch.tensor([list(new_ids)], device=self.device), past_key_values=self.cache,
                            use_cache=True, output_hidden_states=want_aux)
        aux = (torch.cat([out.hidden_states[i][0] for i in self.aux_layer_ids], dim=-1).float()
               if want_aux else None)
        return out.logits[0].float(), aux

    def crop(self, length: int) -> None:
        crop_to(self.cache, length)


@torch.no_grad()
def speculative_decode(verifier: torch.nn.Module, draft: torch.nn.Module, prompt: Sequence[int], k: int,
                       max_new_tokens: int, aux_layer_ids: Sequence[int], sampling: Sampling = GREEDY,
                       cached: bool = False, accept_rule=accept_draft_token, on_round=None) -> Decode:
    """Chain speculative decoding: the verifier's forward over the prompt gives the first token and the aux
    states; then each step the draft proposes `k` tokens, one verifier forward scores all of them, and `verify`
    keeps an accepted prefix plus one verifier token (greedy: the longest prefix equal to the verifier's greedy
    tokens plus its next token; T > 0: speculative sampling).

    Every step proposes all `k` tokens, also near the end; the continuation is cut to `max_new_tokens`
    afterwards, while `accepted` counts what each verify step accepted. `cached` keeps the verifier's KV cache
    and the draft's step-0 entries across steps (same decisions; only rounding differs). `on_round(m, drafts,
    logits, n)`, if given, sees each verify step: the draft tokens after ids[:m + 1], the verifier's logits at
    positions m .. m+k (conditioned on them) and how many were accepted."""
    ids = list(prompt)
    chain = DraftChain(draft, cached=cached)
    if cached:
        verifier_cache = VerifierCache(verifier, aux_layer_ids)
        logits, aux = verifier_cache.forward(ids)
        ids.append(choose(logits[-1], sampling))
    else:
        first = verifier_pass(verifier, ids, aux_layer_ids)
        aux = first.aux
        ids.append(choose(first.logits[-1], sampling))
    accepted = []
    while len(ids) - len(prompt) < max_new_tokens:
        drafts, draft_logits = chain.propose(ids, aux, k, sampling)
        draft_q = None if sampling.greedy else [draft_probs(draft, lg, sampling) for lg in draft_logits]
        m = len(ids) - 1
        if cached:
            logits, new_aux = verifier_cache.forward([ids[-1], *drafts])  # positions m .. m+k
            n, token = verify(drafts, logits, draft_q, sampling, accept_rule)
            if on_round is not None:
                on_round(m, drafts, logits, n)
            verifier_cache.crop(m + n + 1)  # keep x_m and the accepted drafts; the next forward starts at the token
            aux = torch.cat([aux, new_aux[:n + 1]])
        else:
            checked = verifier_pass(verifier, ids + drafts, aux_layer_ids)
            n, token = verify(drafts, checked.logits[m:], draft_q, sampling, accept_rule)
            if on_round is not None:
                on_round(m, drafts, checked.logits[m:], n)
            # The verifier's states of the accepted tokens are exact: a causal model's position t never sees later ones.
            aux = checked.aux[:m + n + 1]
        ids += drafts[:n] + [token]
        accepted.append(n)
    return Decode(tokens=ids[len(prompt):len(prompt) + max_new_tokens], accepted=accepted)
