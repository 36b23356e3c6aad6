"""The verifier decoding alone, one token per forward: the reference speculative decoding (eagle3/decoding/drafting.py)
is checked and timed against."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from eagle3.decoding.drafting import GREEDY, Sampling, VerifierCache, choose


@torch.no_grad()
def plain_decode(verifier: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int,
                 sampling: Sampling = GREEDY, cached: bool = True) -> list[int]:
    """The verifier alone, one token per forward (greedy or sampled): the reference of the lossless check and
    the baseline speculative decoding is timed against. Uncached and greedy it is `greedy_decode`."""
    if not cached:
        ids = list(prompt)
        for _ in range(max_new_tokens):
            ids.append(choose(next_token_logits(verifier, ids), sampling))
        return ids[len(prompt):]
    verifier_cache = VerifierCache(verifier)
    logits, _ = verifier_cache.forward(prompt)
    tokens = [choose(logits[-1], sampling)]
    while len(tokens) < max_new_tokens:
        logits, _ = verifier_cache.forward(tokens[-1:])
        tokens.append(choose(logits[-1], sampling))
    return tokens


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
