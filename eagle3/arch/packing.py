"""The packed micro-batch's length that the draft's attention can take: flex attention's block masks grow by whole
blocks at each TTT step."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)

FLEX_BLOCK = 128  # flex attention's default block size, which speculators' block masks use


def packed_len(total_seq_len: int, attn_impl: str, ttt_steps: int) -> int:
    """Tokens per packed micro-batch: data.total_seq_len, rounded up to whole flex-attention blocks when flex
    attention runs more than one TTT step. speculators extends the block mask by whole blocks at each TTT step,
    so any other length fails at the second step ("block_mask was created for a larger length ...")."""
    if attn_impl != "simple_flex_attention" or ttt_steps < 2 or total_seq_len % FLEX_BLOCK == 0:
        return total_seq_len
    padded = -(-total_seq_len // FLEX_BLOCK) * FLEX_BLOCK
    log.warning("data.total_seq_len=%d packs %d tokens per micro-batch: flex attention with %d TTT steps needs a "
                "multiple of %d", total_seq_len, padded, ttt_steps, FLEX_BLOCK)
    return padded
