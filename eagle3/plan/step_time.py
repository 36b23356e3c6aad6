"""The time of a run's optimizer step: the kernels of one micro-batch (the draft's, and with data=online the verifier's
forward) with their work, turned into seconds at this machine's measured rates (eagle3.plan.roofline)."""

from __future__ import annotations

from dataclasses import dataclass

from eagle3.arch.draft import block_size, dflash_anchors, parameter_counts, sampled_share
from eagle3.config import DraftConfig, DraftKind
from eagle3.plan.parts import PEAK_FLOPS, UTILIZATION, Machine, PlannedRun, Shape, VerifierShape


@dataclass
class Matmul:
    """A group of a step's kernels of one shape, and their work (FLOPs; the loss: logits) as eagle3.plan.roofline counts
    it for that shape (nominal_flops): what its measured rate turns into seconds."""

    name: str
    shape: Shape
    flops: float


def verifier_matmuls(verifier: VerifierShape, seq: int) -> list[Matmul]:
    """The verifier's forward over one micro-batch: 2 x the weights a token goes through (its attention projections
    at their shapes, the rest at the MLP's), and attention in every layer (scores and values over the whole T x T,
    as the CPU kernels compute them under a mask). No lm_head: it is never run."""
    h, layers = verifier.hidden_size, verifier.num_layers
    projections = layers * (2 * h * verifier.q_dim + h * verifier.kv_dim)
    mlp = max(0, verifier.active_params - projections)
    head_dim = min(64, verifier.q_dim)  # the config's head count is not in its shape: a common head width
    heads = max(1, verifier.q_dim // head_dim)
    return [Matmul("verifier: attention projections", ("mm", seq, h, verifier.q_dim), seq * 2 * projections),
            Matmul("verifier: MLP", ("mm", seq, h, verifier.mlp_width), seq * 2 * mlp),
            Matmul("verifier: attention", ("sdpa", seq, heads, head_dim, seq, 0),
                   layers * 2 * 2 * heads * head_dim * seq * seq)]


def verifier_flops(verifier: VerifierShape, seq: int) -> float:
    return sum(m.flops for m in verifier_matmuls(verifier, seq))


def step_matmuls(draft: DraftConfig, seq: int, train_lm_head: bool, checkpointing: bool,
                 attn_impl: str = "sdpa") -> list[Matmul]:
    """The kernels of one micro-batch. Trainable weights 6x per token (forward, backward to inputs and to
    weights) in each of the TTT steps: the decoder layers, and the lm_head when trained (frozen: 4x, forward and
    backward to its input); fc once, before the steps (4x: its input, the verifier's hidden states, needs no
    gradient); the targets' head once (2x, forward only); attention per TTT step t over T x T(t+1) scores (sdpa
    and eager compute every score their mask hides; flex attention only the causal half); the loss over the draft
    vocabulary per TTT step."""
    counts = parameter_counts(draft, train_lm_head)
    h, steps, dv = draft.hidden_size, sampled_share(draft), draft.draft_vocab_size
    n_aux, inter = len(draft.aux_layer_ids), draft.intermediate_size
    heads, hd = draft.num_attention_heads, draft.head_dim
    qd = heads * hd
    layers = counts["decoder layers: attention"][0] + counts["decoder layers: MLP"][0]
    attn_w = counts["decoder layers: attention"][0]
    per_step = 6 + (2 if checkpointing else 0)  # checkpointing: every layer's forward once more
    out = [Matmul("draft: fc (aux states -> H), once", ("mm", seq, n_aux * h, h), seq * 4 * n_aux * h * h),
           Matmul("draft: decoder attention projections x TTT", ("mm", seq, 2 * h, qd),
                  seq * steps * per_step * attn_w),
           Matmul("draft: decoder MLP x TTT", ("mm", seq, h, inter), seq * steps * per_step * (layers - attn_w)),
           Matmul("draft: lm_head x TTT", ("mm", seq, h, dv), seq * steps * (6 if train_lm_head else 4) * dv * h),
           Matmul("draft: targets' head, once", ("mm", seq, h, dv), seq * 2 * dv * h)]
    share = 0.5 if attn_impl == "simple_flex_attention" else 1.0  # flex skips what its mask hides
    passes = 3 + (1 if checkpointing else 0)  # forward, backward (twice the forward), the recompute
    if draft.kind == DraftKind.dflash:
        return out[:1] + _dflash_matmuls(draft, seq, counts, passes, share)
    if draft.kind == DraftKind.peagle:  # one pass over the sampled positions, attending to each other
        s = round(seq * steps)
        out.append(Matmul("draft: attention", ("sdpa", s, heads, hd, s, 1),
                          draft.num_layers * passes * 2 * 2 * qd * s * s * share))
        out.append(Matmul("draft: loss over the draft vocabulary", ("loss", s, dv), s * dv))
        return out
    for t in range(draft.ttt_steps):
        keys = seq * (t + 1)
        # flex: each query's causal half of the first T keys and the t diagonal ones after it
        attended = keys if share == 1.0 else seq / 2 + t
        out.append(Matmul(f"draft: attention, TTT step {t}", ("sdpa", seq, heads, hd, keys, 1),
                          draft.num_layers * passes * 2 * 2 * qd * seq * attended))
    out.append(Matmul("draft: loss over the draft vocabulary x TTT", ("loss", seq, dv), draft.ttt_steps * seq * dv))
    return out


def _dflash_matmuls(draft: DraftConfig, seq: int, counts: dict[str, tuple[int, bool]], passes: int,
                    share: float) -> list[Matmul]:
    """DFlash's matmuls after fc: the layers' projections over the Q block tokens (k/v also over the T context
    states), the frozen lm_head and targets' head over Q, the attention of Q queries over T + Q keys, the loss."""
    h, dv, heads, hd = draft.hidden_size, draft.draft_vocab_size, draft.num_attention_heads, draft.head_dim
    qd, kvd = heads * hd, draft.num_key_value_heads * hd
    block = block_size(draft)
    q = dflash_anchors(block, seq) * block
    attn_w, mlp_w = counts["decoder layers: attention"][0], counts["decoder layers: MLP"][0]
    kv_w = draft.num_layers * 2 * h * kvd
    return [Matmul("draft: decoder projections over the blocks (+ k/v over the context)", ("mm", q, h, qd),
                   6 * (q * attn_w + seq * kv_w)),
            Matmul("draft: decoder MLP over the blocks", ("mm", q, h, draft.intermediate_size), 6 * q * mlp_w),
            Matmul("draft: lm_head over the blocks", ("mm", q, h, dv), q * 4 * dv * h),
            Matmul("draft: targets' head over the blocks", ("mm", q, h, dv), q * 2 * dv * h),
            Matmul("draft: attention, blocks over context + blocks", ("sdpa", q, heads, hd, seq + q, 1),
                   draft.num_layers * passes * 2 * 2 * qd * q * (seq + q) * share),
            Matmul("draft: loss over the draft vocabulary", ("loss", q, dv), q * dv)]


def matmul_seconds(matmuls: list[Matmul], rates: dict[Shape, float]) -> float | None:
    """Seconds of `matmuls` at the measured `rates` of their shapes; None when a shape has no rate."""
    if not all(m.shape in rates for m in matmuls if m.flops):
        return None
    return sum(m.flops / rates[m.shape] for m in matmuls if m.flops)


@dataclass
class StepTime:
    flops: float           # the draft's, per optimizer step
    verifier_flops: float  # the online verifier's forward, per optimizer step (0 without one)
    seconds: float
    rate_note: str         # what rate the time assumes, and where it came from


def step_time(run: PlannedRun, machine: Machine, attn: str, online: VerifierShape | None) -> StepTime:
    """One optimizer step's work and time: at this machine's measured rates at the step's shapes, or (a shape
    without one) at an assumed share of the device's peak."""
    draft, seq, accum, device_type = run.draft, run.data.total_seq_len, run.optim.grad_accum, machine.device_type
    matmuls = step_matmuls(draft, seq, run.train_lm_head, draft.gradient_checkpointing, attn)
    verifier_mm = verifier_matmuls(online, seq) if online is not None else []
    flops = sum(m.flops for m in matmuls if m.shape[0] != "loss") * accum
    forward_flops = sum(m.flops for m in verifier_mm) * accum
    rates, rate_source = machine.matmul_rates([m.shape for m in matmuls + verifier_mm]) if machine.matmul_rates \
        else ({}, "")
    measured = matmul_seconds(matmuls + verifier_mm, rates)
    if measured is not None:
        return StepTime(flops, forward_flops, measured * accum,
                        f"at this machine's kernel rates at the step's shapes, {rate_source}")
    peak_name = "dense bf16 peak of an H100/H200" if device_type == "cuda" else "a rough CPU figure"
    return StepTime(flops, forward_flops, (flops + forward_flops) / (PEAK_FLOPS[device_type] * UTILIZATION),
                    f"at an assumed {UTILIZATION:.0%} of {PEAK_FLOPS[device_type] / 1e12:g} TFLOP/s, {peak_name}; "
                    f"{rate_source or 'no measured rate'}")
