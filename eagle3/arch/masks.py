"""The draft's dense attention masks (`sdpa`, `eager`) built by broadcasting instead of by vmap.

speculators' drafts build their training masks from a flex-attention `mask_mod` (EAGLE-3's causal-per-document
mask, P-EAGLE's parallel groups, DFlash's anchor blocks) with torch's `create_mask`, which runs the mask_mod one
(query, key) pair at a time under vmap: about 5 ms of Python per forward on this CPU whatever the row's length,
a quarter of a tiny draft's whole training step. Each of those mask_mods is elementwise tensor arithmetic and
indexing, so evaluating it once on a column of query indices and a row of key indices gives the same mask by
broadcasting (0.2 ms at 128 positions). `use_broadcast_masks(model)` points a draft's mask builder here when it is
torch's `create_mask` or speculators' `create_float_mask`; flex attention's block masks are left as they are.
tests/arch/test_masks.py holds every speculators mask_mod's mask equal to create_mask's.
"""

from __future__ import annotations

import torch


def broadcast_mask(mask_mod, B: int | None = None, H: int | None = None, Q_LEN: int = 0,  # noqa: N803
                   KV_LEN: int = 0, device: torch.device | str | None = None) -> torch.Tensor:
    """torch's `create_mask(mask_mod, B, H, Q_LEN, KV_LEN, device)`: a [B, H, Q_LEN, KV_LEN] boolean mask (B, H
    None: 1), by one call of `mask_mod` on broadcasting index tensors."""
    zero = torch.zeros((), dtype=torch.long, device=device)
    q_idx = torch.arange(Q_LEN, device=device)[:, None]
    kv_idx = torch.arange(KV_LEN, device=device)[None, :]
    mask = torch.as_tensor(mask_mod(zero, zero, q_idx, kv_idx), dtype=torch.bool, device=device)
    return mask.expand(B or 1, H or 1, Q_LEN, KV_LEN).contiguous()


def broadcast_float_mask(mask_mod, B: int | None = None, H: int | None = None, Q_LEN: int = 0,  # noqa: N803
                         KV_LEN: int = 0, device: torch.device | str | None = None,
                         dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """speculators' `create_float_mask`: broadcast_mask's mask as the scores' addend, 0 where attended and -inf
    elsewhere, in `dtype` (speculators' default, bf16)."""
    allowed = broadcast_mask(mask_mod, B, H, Q_LEN, KV_LEN, device)
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(~allowed, float("-inf"))


def use_broadcast_masks(model: torch.nn.Module) -> torch.nn.Module:
    """`model` (a speculators draft) building its dense masks with broadcast_mask / broadcast_float_mask where it
    would build them with torch's create_mask / speculators' create_float_mask (sdpa, eager); unchanged otherwise."""
    from speculators.models.attention import create_float_mask
    from torch.nn.attention.flex_attention import create_mask

    builder = getattr(model, "_create_mask_fn", None)
    if builder is create_mask:
        model._create_mask_fn = broadcast_mask
    elif builder is create_float_mask:
        model._create_mask_fn = broadcast_float_mask
    return model
