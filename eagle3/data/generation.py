"""What regeneration's engines share (eagle3/data/regenerate.py: transformers in this process;
eagle3/data/regenerate_vllm.py: the verifier served by vLLM): a prompt's generated response, what a batch generator
is, and each prompt's seed, so a response does not depend on the engine's batching."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

# (prompts, budgets, the first prompt's index, tick=...) -> their responses; tick(n) reports n more tokens generated.
BatchGenerator = Callable[..., list["Generation"]]
Tick = Callable[[int], None]


@dataclass
class Generation:
    """One prompt's response: its token ids (the end-of-sequence token included when reached)."""

    ids: list[int]
    truncated: bool  # stopped by max_new_tokens or the verifier's positions, not by an end-of-sequence token


def row_seed(seed: int, index: int) -> int:
    """The seed of prompt `index`'s draws: distinct for every (seed, index) pair."""
    return int(hashlib.sha256(f"{seed}:{index}".encode()).hexdigest()[:15], 16)
