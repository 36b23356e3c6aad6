"""The draft's TTT attention on CPU (eagle3/arch/ttt_attention.py) against speculators' own masked sdpa, the oracle:
the same losses, metrics and gradients up to fp32 rounding, over packed documents with padding, 1-token documents,
grouped KV heads and 1 to 3 TTT steps; masks of any other structure take the masked path unchanged."""

from __future__ import annotations

import copy

import pytest
import torch

from bench.gpu import build

SHAPE = dict(hidden=64, intermediate=128, heads=4, kv_heads=2, head_dim=16, vocab=512, draft_vocab=128, seq=160,
             doc=40)


def packed(lengths: list[int], total: int) -> dict:
    """Documents of `lengths` packed into `total` positions, the rest padding (document id -1, no loss)."""
    gen = torch.Generator().manual_seed(1)
    h = SHAPE["hidden"]
    document_ids = torch.full((1, total), -1)
    position_ids = torch.zeros(1, total, dtype=torch.long)
    q = 0
    for d, n in enumerate(lengths):
        document_ids[0, q:q + n], position_ids[0, q:q + n] = d, torch.arange(1, n + 1)
        q += n
    return {"hidden_states": torch.randn(1, total, 3 * h, generator=gen),
            "verifier_last_hidden_states": torch.randn(1, total, h, generator=gen),
            "input_ids": torch.randint(0, SHAPE["vocab"], (1, total), generator=gen),
            "loss_mask": (document_ids >= 0).long(), "position_ids": position_ids, "document_ids": document_ids}


@pytest.mark.parametrize("ttt_steps", [1, 3])
@pytest.mark.parametrize("lengths", [[37, 1, 60, 2, 45], [150]], ids=["docs-padding", "one-doc"])
def test_ttt_attention_gives_the_masked_sdpa_losses_and_gradients(ttt_steps, lengths):
    from speculators.losses import resolve_loss_config

    import eagle3.arch.ttt_attention as ttt
    from eagle3.arch.ttt_attention import use_ttt_attention

    fast, _ = build(SHAPE, torch.device("cpu"), attn_impl="sdpa")  # a draft as the project builds one: marked
    oracle = use_ttt_attention(copy.deepcopy(fast), on=False)
    batch = packed(lengths, 160)
    kwargs = {"ttt_steps": ttt_steps, "loss_config": resolve_loss_config("kl_div", "eager")}
    results = []
    for model in (oracle, fast):
        model.train().zero_grad()
        ttt._last = None
        _, loss, metrics = model(**batch, **kwargs)
        taken = ttt._last is not None and ttt._last[1] is not None
        assert taken == (model is fast)  # the fast draft's attention took the TTT path, the oracle's did not
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), metrics, grads))
    (loss_a, metrics_a, grads_a), (loss_b, metrics_b, grads_b) = results
    torch.testing.assert_close(loss_b, loss_a, rtol=1e-5, atol=0)
    assert sorted(metrics_a) == sorted(metrics_b)
    for k in metrics_a:
        torch.testing.assert_close(metrics_b[k].float(), metrics_a[k].float(), rtol=1e-5, atol=1e-6, msg=k)
    assert sorted(grads_a) == sorted(grads_b) and any("self_attn" in n for n in grads_a)
    for n in grads_a:
        scale = grads_a[n].abs().max().item()
        torch.testing.assert_close(grads_b[n], grads_a[n], rtol=0, atol=1e-5 * max(scale, 1e-3), msg=n)


def test_a_mask_of_another_structure_takes_the_masked_path():
    from eagle3.arch.ttt_attention import plan_of

    n = 8
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    eye = torch.eye(n, dtype=torch.bool)
    assert plan_of(torch.cat([causal, eye, eye], -1)[None, None], n, 3 * n).steps == 3
    window = causal & ~torch.ones(n, n, dtype=torch.bool).tril(-3)  # a sliding window: not per document
    shifted = torch.cat([causal, eye.roll(1, 0)], -1)                # a later step that is not the diagonal
    for mask in (window, shifted, causal.float()):
        assert plan_of(mask[None, None], n, mask.shape[-1]) is None


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_ttt_attention_equals_masked_sdpa_at_every_position_and_input(steps):
    """The kernel level, every query position (padding and 1-token documents included, which the loss masks or
    barely weighs): outputs and the gradients of q, k and v against torch's sdpa under the same boolean mask."""
    from eagle3.arch.ttt_attention import plan_of, ttt_attention

    n, heads, d = 48, 3, 8
    docs = torch.full((n,), -1)
    q0 = 0
    for i, length in enumerate([10, 1, 15, 2, 1, 12]):
        docs[q0:q0 + length] = i
        q0 += length
    pos = torch.arange(n)
    first = ((pos[None] <= pos[:, None]) & (docs[:, None] == docs[None]) & (docs[:, None] >= 0)) | torch.eye(n).bool()
    mask = torch.cat([first, *[torch.eye(n, dtype=torch.bool)] * (steps - 1)], -1)[None, None]
    gen = torch.Generator().manual_seed(steps)
    q, k, v = (torch.randn(1, heads, length, d, generator=gen, dtype=torch.float64).float().requires_grad_()
               for length in (n, steps * n, steps * n))
    grad = torch.randn(1, n, heads, d, generator=gen)
    plan = plan_of(mask, n, steps * n)
    assert plan is not None and plan.alone is not None
    ours = ttt_attention(q, k, v, plan, d ** -0.5)
    theirs = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    for a, b in zip(torch.autograd.grad((ours * grad).sum(), (q, k, v)),
                    torch.autograd.grad((theirs * grad).sum(), (q, k, v)), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
