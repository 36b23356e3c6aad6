"""Flex attention (what CUDA runs train with) needs packed lengths of whole 128-token blocks once a draft runs
more than one TTT step; the trainer rounds data.total_seq_len up to one (eagle3.arch.packing.packed_len). Flex
attention's forward also runs, unfused, on CPU, so this is checked here; tests/device/test_gpu.py trains with it."""

from __future__ import annotations

import pytest
import torch

from bench.gpu import SHAPES, build
from eagle3.arch.packing import packed_len
from eagle3.errors import ConfigError
from factories import checked_config

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def packed_batch(shape: dict, docs: int, length: int) -> dict:
    """`docs` documents of shape["doc"] tokens packed into `length` positions, the rest padding (document id -1,
    no loss), as the reader lays out a micro-batch."""
    gen = torch.Generator().manual_seed(0)
    used, h = docs * shape["doc"], shape["hidden"]
    document_ids = torch.full((1, length), -1)
    document_ids[0, :used] = torch.arange(docs).repeat_interleave(shape["doc"])
    position_ids = torch.zeros(1, length, dtype=torch.long)
    position_ids[0, :used] = (torch.arange(used) % shape["doc"]) + 1
    return {"hidden_states": torch.randn(1, length, 3 * h, generator=gen),
            "verifier_last_hidden_states": torch.randn(1, length, h, generator=gen),
            "input_ids": torch.randint(0, shape["vocab"], (1, length), generator=gen),
            "loss_mask": (document_ids >= 0).long(), "position_ids": position_ids, "document_ids": document_ids}


def test_flex_ttt_steps_need_whole_blocks_and_the_packed_length_has_them():
    from speculators.losses import resolve_loss_config

    shape = dict(SHAPES["small"], doc=100)
    model, _ = build(shape, torch.device("cpu"), attn_impl="simple_flex_attention")
    model.eval()
    kwargs = {"ttt_steps": 3, "loss_config": resolve_loss_config("kl_div", "eager")}
    configured = 200  # two documents of 100 tokens: not a multiple of 128
    # speculators' own behaviour at such a length; when this stops raising, packed_len can go.
    with torch.no_grad(), pytest.raises(RuntimeError, match="block_mask was created for a larger length"):
        model(**packed_batch(shape, 2, configured), **kwargs)
    length = packed_len(configured, "simple_flex_attention", ttt_steps=3)
    assert length == 256
    with torch.no_grad():
        _, loss, metrics = model(**packed_batch(shape, 2, length), **kwargs)
    assert torch.isfinite(loss) and metrics["full_acc_2_total"] > 0
    # Nothing changes where nothing fails: other attention, one TTT step, whole blocks already.
    assert packed_len(configured, "sdpa", 3) == packed_len(configured, "simple_flex_attention", 1) == configured
    assert packed_len(512, "simple_flex_attention", 3) == 512


def test_flex_attention_on_the_cpu_is_refused_before_anything_is_built():
    """attn_impl=simple_flex_attention with device=cpu ran into torch's "FlexAttention does not support backward on
    CPU" traceback at the first step, leaving a failed run dir; the launcher's and the sweeper's device check
    (eagle3.run.plan_guard.check_devices) refuse it first."""
    from eagle3.run.plan_guard import check_devices

    cfg = checked_config(["model.draft.attn_impl=simple_flex_attention", "device=cpu"])
    with pytest.raises(ConfigError, match=r"^model.draft.attn_impl: simple_flex_attention has no backward on CPU"):
        check_devices(cfg)
    check_devices(checked_config(["model.draft.attn_impl=auto", "device=cpu"]))
