"""The draft's dense masks built by broadcasting (eagle3/arch/masks.py) against torch's create_mask and speculators'
create_float_mask, the oracles, on each of speculators' mask_mods: EAGLE-3's causal-per-document mask (padding,
1-token documents, a sliding window), P-EAGLE's parallel groups and DFlash's anchor blocks (causal or not, windowed
or not); and which drafts build them so."""

from __future__ import annotations

import pytest
import torch
from test_ttt_attention import SHAPE

from bench.gpu import build

# 5 documents of 37, 1, 60, 2 and 45 positions, then 15 of padding (document id -1)
DOCUMENTS = torch.cat([torch.full((n,), d) for d, n in enumerate([37, 1, 60, 2, 45])] + [torch.full((15,), -1)])
L = len(DOCUMENTS)


def eagle3_mod(window):
    from speculators.models.eagle3.attention import create_combined_mask_mod

    return create_combined_mask_mod(DOCUMENTS, L, sliding_window=window), L, L


def peagle_mod(window):
    from speculators.models.peagle.attention import create_peagle_mask_mod
    from speculators.models.peagle.data import generate_cod_sample_indices

    torch.manual_seed(0)
    anchors, depth = generate_cod_sample_indices(L, (DOCUMENTS >= 0).long(), num_depths=3)
    return create_peagle_mask_mod(anchors, depth, DOCUMENTS, sliding_window=window), len(anchors), len(anchors)


def dflash_mod(window, non_causal=False):
    from speculators.models.dflash.attention import create_anchor_block_mask_mod

    anchors = torch.tensor([3, 40, 41, 90, 120, 150])
    return create_anchor_block_mask_mod(DOCUMENTS, L, anchors, block_size=4, sliding_window=window,
                                        sliding_window_non_causal=non_causal)


MODS = {"eagle3": (eagle3_mod, None), "eagle3-window": (eagle3_mod, 16), "peagle": (peagle_mod, None),
        "peagle-window": (peagle_mod, 16), "dflash": (dflash_mod, None), "dflash-window-causal": (dflash_mod, 16),
        "dflash-window-non-causal": (lambda w: dflash_mod(w, non_causal=True), 16)}


@pytest.mark.parametrize("name", list(MODS))
def test_broadcast_masks_equal_create_mask_and_create_float_mask(name):
    from speculators.models.attention import create_float_mask
    from torch.nn.attention.flex_attention import create_mask

    from eagle3.arch.masks import broadcast_float_mask, broadcast_mask

    make, window = MODS[name]
    mask_mod, q_len, kv_len = make(window)
    expected = create_mask(mask_mod, None, None, q_len, kv_len, "cpu")
    got = broadcast_mask(mask_mod, B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len, device="cpu")
    assert got.shape == expected.shape == (1, 1, q_len, kv_len) and got.dtype == torch.bool and got.is_contiguous()
    assert torch.equal(got, expected)
    assert 0 < int(got.sum()) < got.numel()  # neither all attended nor all masked: the comparison means something
    floats = broadcast_float_mask(mask_mod, B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len, device="cpu")
    assert torch.equal(floats, create_float_mask(mask_mod, B=None, H=None, Q_LEN=q_len, KV_LEN=kv_len, device="cpu"))
    assert floats.dtype == torch.bfloat16


@pytest.mark.parametrize("attn_impl", ["sdpa", "eager", "simple_flex_attention"])
def test_drafts_build_their_dense_masks_by_broadcasting_and_flex_keeps_its_block_masks(attn_impl):
    from torch.nn.attention.flex_attention import create_block_mask

    from eagle3.arch.masks import broadcast_float_mask, broadcast_mask

    draft, _ = build(SHAPE, torch.device("cpu"), attn_impl=attn_impl)
    expected = {"sdpa": broadcast_mask, "eager": broadcast_float_mask,
                "simple_flex_attention": create_block_mask}[attn_impl]
    assert draft._create_mask_fn is expected
