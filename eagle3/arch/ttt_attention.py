"""The draft's attention over its test-time-training (TTT) steps on CPU, without the scores its mask throws away.

speculators' EAGLE-3 forward (models/eagle3/core.py) runs k TTT steps over one packed row of L positions; step t's
keys are those of steps 0..t (a KV cache of (t+1) x L), under a dense boolean mask for `sdpa`: causal within each
document over the step-0 keys, and for every later step only the query's own position (a diagonal). transformers'
sdpa then computes all L x (t+1)L scores, nearly all of them masked, through the masked (not the causal) kernel.

Here the same attention is computed from its parts: each document's causal attention over its step-0 keys (the
causal kernel, `_scaled_dot_product_flash_attention_for_cpu`, which also gives each query's log-sum-exp), a position
that sees only itself at step 0 (padding, 1-token documents) directly, and the later steps' diagonal scores
elementwise, all combined by their log-sum-exp. It equals the masked attention up to fp32 rounding, forward and
backward (tests/arch/test_ttt_attention.py checks it against speculators' own path). The causal kernel's log-sum-exp is
not differentiable in torch; `_SegmentCausal` gives it a backward by folding its gradient g into the kernel's own
backward: that backward reads D_i = rowsum(dO_i * O_i) from the output it is handed, and the log-sum-exp's
gradient adds g_i * P_ij to the scores' gradient, i.e. D_i - g_i in place of D_i; one zero column appended to q, k
and v (scores unchanged) carries -g_i in the output and 1 in dO.

`use_ttt_attention(model)` marks a draft's attention modules; transformers' `sdpa` entry then routes a marked
module's call here when its mask has exactly this structure (on CPU, no dropout), and everything else (the
verifier, a draft at drafting time with its own masks, P-EAGLE's sampled positions) to transformers' sdpa as before.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

MARK = "_eagle3_ttt_attention"


@dataclass
class Plan:
    """How one mask splits: the causal runs (start, end) over the step-0 keys of at least 2 positions, the positions
    that see only themselves at step 0, and the TTT steps so far (keys = steps x L)."""

    segments: list[tuple[int, int]]
    alone: torch.Tensor | None   # [L] bool, or None when there is no such position
    steps: int


_last: tuple[weakref.ref, Plan | None] | None = None


def plan_of(mask: torch.Tensor | None, q_len: int, k_len: int) -> Plan | None:
    """The mask's Plan, or None when it is not causal-per-document over the step-0 keys plus one diagonal per later
    step (then the caller computes the masked attention as it is). The mask is the same tensor for every layer of a
    step: its plan is kept for the next call."""
    global _last
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[:2] != (1, 1):
        return None
    if q_len < 2 or mask.shape[2] != q_len or mask.shape[3] != k_len or k_len % q_len:
        return None
    if _last is not None and _last[0]() is mask:
        return _last[1]
    plan = _structure(mask[0, 0], q_len, k_len // q_len)
    _last = (weakref.ref(mask), plan)
    return plan


def _structure(mask: torch.Tensor, n: int, steps: int) -> Plan | None:
    first = mask[:, :n]
    start = first.to(torch.uint8).argmax(-1)  # each row's first key (its own position at the latest)
    pos = torch.arange(n, device=mask.device)
    if not bool(first[pos, pos].all()):
        return None
    expected = (pos[None, :] >= start[:, None]) & (pos[None, :] <= pos[:, None])
    if not torch.equal(first, expected):
        return None
    begins = start == pos
    # A row that does not begin a run continues the previous row's run.
    if not bool((begins[1:] | (start[1:] == start[:-1])).all()):
        return None
    eye = torch.eye(n, dtype=torch.bool, device=mask.device)
    if any(not torch.equal(mask[:, t * n:(t + 1) * n], eye) for t in range(1, steps)):
        return None
    bounds = begins.nonzero().flatten().tolist() + [n]
    runs = [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b - a >= 2]
    alone_rows = [a for a, b in zip(bounds[:-1], bounds[1:]) if b - a == 1]
    alone = None
    if alone_rows:
        alone = torch.zeros(n, dtype=torch.bool, device=mask.device)
        alone[alone_rows] = True
    return Plan(runs, alone, steps)


_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _SegmentCausal(torch.autograd.Function):
    """(output, log-sum-exp) of causal attention within each run [a, b) of positions, both differentiable; rows
    outside every run: 0 and -inf."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, runs: list[tuple[int, int]],
                scale: float) -> tuple[torch.Tensor, torch.Tensor]:
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for a, b in runs:
            o, s = _flash(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], 0.0, True, scale=scale)
            out[:, :, a:b] = o
            lse[:, :, a:b] = s
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.runs, ctx.scale = runs, scale
        return out, lse

    @staticmethod
    def backward(ctx: Any, d_out: torch.Tensor | None, d_lse: torch.Tensor | None):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        if d_out is None:
            d_out = torch.zeros_like(out)
        for a, b in ctx.runs:
            part = slice(a, b)
            qs, ks, vs, os_, go = q[:, :, part], k[:, :, part], v[:, :, part], out[:, :, part], d_out[:, :, part]
            if d_lse is not None:  # the extra column: scores unchanged, D_i - g_i read by the kernel
                zero = qs.new_zeros(*qs.shape[:-1], 1)
                qs, ks, vs = (torch.cat([t, zero], -1) for t in (qs, ks, vs))
                os_ = torch.cat([os_, -d_lse[:, :, part, None]], -1)
                go = torch.cat([go, torch.ones_like(zero)], -1)
            gq, gk, gv = _flash_backward(go.contiguous(), qs.contiguous(), ks.contiguous(), vs.contiguous(),
                                         os_.contiguous(), lse[:, :, part].contiguous(), 0.0, True,
                                         scale=ctx.scale)
            d = q.shape[-1]
            dq[:, :, part], dk[:, :, part], dv[:, :, part] = gq[..., :d], gk[..., :d], gv[..., :d]
        return dq, dk, dv, None, None


def ttt_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, plan: Plan,
                  scale: float) -> torch.Tensor:
    """[B, L, heads, head_dim]: the masked attention `plan` describes (query [B, heads, L, d]; key and value
    [B, heads, steps x L, d], KV heads already repeated to the query's)."""
    n = query.shape[2]
    k0, v0 = key[:, :, :n], value[:, :, :n]
    out, lse = _SegmentCausal.apply(query, k0, v0, plan.segments, scale)
    if plan.alone is not None:
        alone = plan.alone[:, None]
        lse = torch.where(plan.alone, (query * k0).sum(-1) * scale, lse)
        out = torch.where(alone, v0, out)
    if plan.steps > 1:
        diag = [(query * key[:, :, t * n:(t + 1) * n]).sum(-1) * scale for t in range(1, plan.steps)]
        total = torch.logsumexp(torch.stack([lse, *diag]), 0)
        out = torch.exp(lse - total)[..., None] * out
        for t, score in enumerate(diag, start=1):
            out = out + torch.exp(score - total)[..., None] * value[:, :, t * n:(t + 1) * n]
    return out.transpose(1, 2).contiguous()


def _sdpa(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
          **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' `sdpa` entry: a marked module's TTT attention computed here where its mask allows."""
    if getattr(module, MARK, False) and dropout == 0.0 and query.device.type == "cpu" \
            and not kwargs.get("output_attentions", False):
        plan = plan_of(attention_mask, query.shape[2], key.shape[2])
        if plan is not None:
            groups = query.shape[1] // key.shape[1]
            if groups > 1:
                key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
            scale = scaling if scaling is not None else query.shape[-1] ** -0.5
            return ttt_attention(query, key, value, plan, scale), None
    return _transformers_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                              **kwargs)


_transformers_sdpa: Any = None


def use_ttt_attention(model: torch.nn.Module, on: bool = True) -> torch.nn.Module:
    """`model` (a draft) with its decoder layers' attention marked for the TTT path (`on`; False: unmarked, speculators'
    masked sdpa, as tests/arch/test_ttt_attention.py's oracle); transformers' `sdpa` entry is wrapped once per process
    (unmarked modules go through unchanged)."""
    global _transformers_sdpa
    from transformers.modeling_utils import AttentionInterface

    if _transformers_sdpa is None:
        _transformers_sdpa = AttentionInterface._global_mapping["sdpa"]
        AttentionInterface.register("sdpa", _sdpa)
    for layer in getattr(model, "layers", []):
        attention = getattr(layer, "self_attn", None)
        if attention is not None:
            setattr(attention, MARK, on)
    return model
