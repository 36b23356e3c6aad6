"""The memory and time plan of a run, per rank, computed from the config alone (`launch.py plan=true`).

Pure arithmetic over the typed config parts: no torch, no speculators, nothing built. It counts every tensor
the trainer holds on a rank: the draft's parameters as speculators builds them (Eagle3DraftModel: the frozen
verifier embedding and heads, fc, the decoder layers as eagle3/arch/draft.py counts them, the norms, the
d2t/t2d buffers), gradients and AdamW's two fp32 moments (sharded under FSDP), the
reader's hidden-state buffers (eagle3/data/reader.py), with data=online the verifier every rank holds and its
forward (eagle3/data/online.py; `verifier_terms`), and the activations autograd keeps for one
micro-batch through `ttt_steps` test-time-training steps (derived from speculators' forward; see
`_activations`), plus the largest transient of the backward. tests/plan/test_plan.py checks the parameter
counts against the real model on the meta device, and the planned peak against the measured one on CPU
(bench/plan_memory.py prints the ratios).

Figures are in bytes; the formatter prints GiB. The CUDA figures (bf16 autocast, flex attention by default)
follow the same derivation with the compute dtype's sizes; they were not measured on a GPU yet.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eagle3.arch.draft import block_size, dflash_anchors, layer_step_elements, parameter_counts, sampled_share
from eagle3.config import DataConfig, DistributedConfig, DraftConfig, DraftKind, OptimConfig
from eagle3.device.choice import attn_impl_on
from eagle3.errors import ConfigError

GIB = 1024 ** 3
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Dense bf16 peak of one device (NVIDIA's H100/H200 SXM datasheet, without sparsity) and the share of it a
# one-layer draft's step reaches: an assumption to be replaced by bench/gpu.py's measured MFU.
PEAK_FLOPS = {"cuda": 989e12, "cpu": 1e11}
UTILIZATION = 0.35
# The guard refuses a peak above this share of the device's memory (the allocator's fragmentation, CUDA
# context and library workspaces need the rest).
FIT_SHARE = 0.95
# The exit status of `plan=true` for a plan that does not fit (1 is a refused config), so that a script can gate.
NO_FIT_STATUS = 3


@dataclass
class Term:
    name: str
    bytes: int
    note: str = ""
    on_device: bool = True  # False: host memory (the reader's ring on a GPU run)
    # Terms of one phase of a step are alive together and freed after it; "" = alive throughout. data=online runs
    # the verifier's forward (for the next micro-batch) and the draft's step one after the other, never together,
    # so the peak counts the larger phase, not both.
    phase: str = ""


DRAFT_STEP, VERIFIER_FORWARD = "draft step", "verifier forward"


@dataclass
class VerifierShape:
    """What the plan needs of the verifier that data=online runs in every rank (eagle3.plan.sizes.verifier_shape
    reads it from its config.json and safetensors headers): parameter counts as loaded, and the widths one token's
    forward goes through."""

    params: int          # the causal LM as loaded: embedding, decoder layers, final norm, lm_head
    embedding: int       # embed_tokens + the final norm: the decoder's own parameters (the FSDP2 root when sharded)
    lm_head: int         # 0 when tied to the embedding; a sharded verifier drops it (hidden states never need it)
    layer_params: int    # the largest decoder layer (FSDP2 all-gathers one at a time)
    active_params: int   # decoder weights one token goes through (a MoE: the shared and top-k routed experts only)
    num_layers: int
    hidden_size: int
    q_dim: int           # heads x query head dim
    kv_dim: int          # keys + values per token, all heads
    mlp_width: int       # the widest MLP intermediate per token (a MoE: shared + top-k experts)
    source: str          # where the counts came from


@dataclass
class Plan:
    device_type: str
    world_size: int
    strategy: str
    attn_impl: str
    gradient_checkpointing: bool
    terms: list[Term]
    trainable_params: int
    frozen_params: int
    tokens_per_step: int
    flops_per_step: float
    step_seconds: float
    device_memory: int | None
    device_memory_source: str
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    data_notes: list[str] = field(default_factory=list)
    # data=online: "full" (a copy per rank) or "sharded" (data.shard_verifier over the ranks); None offline.
    online_verifier: str | None = None
    verifier_bytes: int = 0                  # its weights' share of the peak on each rank (all-gathered parts too)
    verifier_if_sharded: int | None = None   # what that would be with data.shard_verifier=true (ranks > 1)
    verifier_flops_per_step: float = 0.0
    rate_note: str = ""  # what rate the step time assumes, and where it came from

    def phase_bytes(self) -> dict[str, int]:
        phases: dict[str, int] = {}
        for t in self.terms:
            if t.on_device and t.phase:
                phases[t.phase] = phases.get(t.phase, 0) + t.bytes
        return phases

    @property
    def peak(self) -> int:
        """What is alive throughout, plus the larger of the phases that run one after the other."""
        always = sum(t.bytes for t in self.terms if t.on_device and not t.phase)
        return always + max(self.phase_bytes().values(), default=0)

    @property
    def largest(self) -> Term:
        return max((t for t in self.terms if t.on_device), key=lambda t: t.bytes)

    def fits(self) -> bool:
        return self.device_memory is None or self.peak <= FIT_SHARE * self.device_memory


@dataclass
class DataStats:
    """What the plan knows about a dataset: train rows' token counts and the hidden-state bytes on disk (0 online)."""

    train_tokens: int
    train_rows: int
    total_tokens: int
    hidden_bytes_on_disk: int
    train_lengths: Sequence[int] | None = None  # each train row's tokens: the run's own count of steps (packing)


def buffer_bytes(draft: DraftConfig) -> int:
    """t2d (bool over the verifier vocabulary) and d2t (int64 offsets), present when the draft vocab is smaller."""
    if draft.draft_vocab_size == draft.vocab_size:
        return 0
    return draft.vocab_size + 8 * draft.draft_vocab_size


def _activations(draft: DraftConfig, seq: int, attn_impl: str, device_type: str,
                 checkpointing: bool) -> tuple[list[Term], int]:
    """Activations of one micro-batch of `seq` tokens, and the largest backward transient.

    Per TTT step, speculators' forward (core.py) keeps for the backward, in elements per token: the layer's
    [embedding, hidden] input (2H, held by the norms' views) and the normed concat q/k/v read (2H); the two
    input norms' normed halves (2H); q after rotary and the attention output twice (3 x heads*head_dim, the
    o_proj input is a contiguous copy); the post-attention residual and its normed (2H); the MLP's input (H);
    the MLP's gate, up, act and product (4I); the final norm's input and normed (2H); the loss's
    log-probabilities and target probabilities (2 x draft vocab, fp32). One more H-wide tensor per step is
    counted because the measurement (bench/plan_memory.py) shows it alive, without a named owner. The cache's
    keys and values grow by T each step, and step t's attention keeps the concatenated ones:
    2 x kv*head_dim x (t+1). Eager attention keeps the softmax (heads x T x T(t+1)); sdpa keeps its additive
    mask (T x T(t+1), compute dtype), but on CPU it takes eagle3.arch.ttt_attention's path (_score_term); flex
    neither.
    Before the steps: the input norm over the n aux states (2 nH) and the targets (T x draft vocab).
    """
    if draft.kind != DraftKind.eagle3:
        return _one_pass_activations(draft, seq, attn_impl, device_type)
    h, n_aux, steps = draft.hidden_size, len(draft.aux_layer_ids), draft.ttt_steps
    kvd, dv = draft.num_key_value_heads * draft.head_dim, draft.draft_vocab_size
    heads = draft.num_attention_heads
    cuda = device_type == "cuda"
    c = 2 if cuda else 4            # compute dtype: bf16 autocast on CUDA, fp32 on CPU
    norm = 4 + 2 if cuda else 4     # a norm's saved elements: fp32 and, under autocast, the bf16 copy
    # CPU (eager loss): fp32 log-probabilities and target probabilities; CUDA (speculators' fused Triton loss):
    # contiguous copies of the step's logits and targets in bf16.
    loss = 2 if cuda else 4
    layers = draft.num_layers
    # sum over steps of the concatenated keys and values, in every layer
    cache_kv = layers * 2 * kvd * steps * (steps + 1) // 2
    layer_step = layer_step_elements(draft, c, norm)  # all layers, without the cache and score terms
    outside_step = 2 * h * norm + 2 * dv * loss
    tri = steps * (steps + 1) // 2  # sum over steps of (t + 1): key length of step t in units of T
    # each layer keeps its own softmax (eager) or additive mask (sdpa, converted from the bool mask per call)
    score_bytes = layers * {"eager": heads * (4 + (2 if cuda else 0)), "sdpa": c}.get(attn_impl, 0)
    ttt_path = attn_impl == "sdpa" and not cuda  # no score matrix kept, none converted again in a recompute
    score_name = {"eager": "softmax scores (heads x T x T(t+1)) per TTT step",
                  "sdpa": "additive attention mask (T x T(t+1)) per TTT step"}.get(attn_impl)
    first = 2 * n_aux * h * norm + dv * c

    terms = [Term("activations: input norm + targets", seq * first, "before the TTT steps")]
    if not checkpointing:
        terms.append(Term(f"activations: decoder layer x {steps} TTT steps", seq * (steps * layer_step + cache_kv * c),
                          "incl. the keys/values each step's attention keeps"))
        terms.append(Term(f"activations: final norm + loss x {steps}", seq * steps * outside_step))
        if ttt_path or not score_name:
            terms.append(_score_term(draft, seq, attn_impl, c))
        else:
            terms.append(Term(f"attention score term ({attn_impl}): {score_name}", seq * seq * tri * score_bytes,
                              f"{'heads x ' if attn_impl == 'eager' else ''}T^2 x {tri} x bytes"))
    else:
        # The checkpoint keeps each step's layer input (2H) and the earlier steps' keys/values (its inputs);
        # sdpa/eager masks stay alive in the recompute's closure; one step's layer lives again in the backward.
        past_kv = layers * 2 * kvd * (steps - 1) * steps // 2
        terms.append(Term(f"activations: layer inputs + cache x {steps} TTT steps (checkpointed)",
                          seq * (steps * (2 * h + (layers - 1) * h) * c + past_kv * c)))
        terms.append(Term(f"activations: final norm + loss x {steps}", seq * steps * outside_step))
        if score_name:
            # speculators' masks as built: bool for sdpa (converted to the compute dtype inside the kernel
            # call), additive float for eager.
            mask_bytes = 1 if attn_impl == "sdpa" else c
            terms.append(Term(f"attention masks ({attn_impl}, kept for the recompute)",
                              seq * seq * tri * mask_bytes, "T^2 x sum(t+1) x bytes"))
        # one layer (the first, the widest) lives again at a time
        recompute = seq * (layer_step_elements(draft, c, norm, layers=1) + 2 * kvd * steps * c)
        if score_name and not ttt_path:  # the last step's score matrix (eager) or converted mask (sdpa), alive again
            recompute += seq * seq * steps * score_bytes // layers
    # The largest transient: the last step's loss working set (logits, log-probs, probs, elementwise loss),
    # or eager attention's score gradients (two of the last step's score matrices).
    loss_transient = seq * dv * (c + 3 * loss)
    score_grads = 2 * heads * seq * seq * steps * 4 if attn_impl == "eager" else 0
    transient = max(loss_transient, score_grads)
    if checkpointing:
        # The last step's layer is recomputed after its loss and final norm were backwarded (freed); the peak
        # is the larger of that and the forward's loss transient.
        recompute = max(0, recompute - seq * outside_step)
        terms.append(Term("recomputed layer (last TTT step, in the backward)", recompute))
        transient = max(loss_transient - recompute, score_grads)
    return terms, transient


def _score_term(draft: DraftConfig, seq: int, attn_impl: str, c: int) -> Term:
    """The attention's term that keeps no T x T(t+1) matrix. flex: the log-sum-exp per head and query. sdpa on CPU
    (eagle3.arch.ttt_attention, a draft's mask being causal per document plus one diagonal per later step): per
    step and layer, the causal kernel's output and log-sum-exp per head, with grouped KV heads the keys and values
    repeated to the query's heads (2 x heads*head_dim x (t+1)), and the step's bool mask while it runs (T x T(t+1),
    1 byte; the last step's, the largest)."""
    heads, layers, steps = draft.num_attention_heads, draft.num_layers, draft.ttt_steps
    if attn_impl != "sdpa":
        return Term(f"attention score term ({attn_impl}): log-sum-exp only, no T x T matrix", seq * heads * steps * 4)
    repeated = 2 * heads * draft.head_dim * steps * (steps + 1) // 2 if heads > draft.num_key_value_heads else 0
    return Term("attention score term (sdpa on CPU, the TTT path): kernel output + log-sum-exp, no T x T matrix",
                seq * (layers * (steps * heads * (draft.head_dim + 1) + repeated) * c + seq * steps),
                "per step and layer, + KV repeated to the heads, + the last step's bool mask T x kT")


def _one_pass_activations(draft: DraftConfig, seq: int, attn_impl: str, device_type: str) -> tuple[list[Term], int]:
    """The kinds that draft in one pass: P-EAGLE over its sampled positions, DFlash over its anchor blocks."""
    one_pass = _peagle_activations if draft.kind == DraftKind.peagle else _dflash_activations
    return one_pass(draft, seq, attn_impl, device_type)


def _peagle_activations(draft: DraftConfig, seq: int, attn_impl: str, device_type: str) -> tuple[list[Term], int]:
    """P-EAGLE's one forward over the S COD-sampled positions (S = T x eagle3.arch.draft.sampled_share): the per-token
    terms of one EAGLE-3 step (its layer's keys and values included) at S tokens instead of k x T, the targets
    over T and their S gathered rows, and one S x S score term (sdpa: speculators' float mask; eager: the
    softmax per head; flex: log-sum-exp only). Checked against the measured peak on CPU (bench/plan_memory.py
    --kind peagle); gradient checkpointing is not modelled for it."""
    h, n_aux, dv, heads = draft.hidden_size, len(draft.aux_layer_ids), draft.draft_vocab_size, draft.num_attention_heads
    kvd = draft.num_key_value_heads * draft.head_dim
    cuda = device_type == "cuda"
    c, norm, loss = (2, 6, 2) if cuda else (4, 4, 4)
    sampled = round(seq * sampled_share(draft))
    per_token = layer_step_elements(draft, c, norm) + draft.num_layers * 2 * kvd * c
    # per layer, sdpa: the float mask speculators builds (create_float_mask); eager: that mask and the softmax
    score = draft.num_layers * {"eager": c + heads * (4 + (2 if cuda else 0)), "sdpa": c}.get(attn_impl, 0)
    terms = [
        Term("activations: sampled aux states, input norm + targets", sampled * (n_aux * h * (c + 2 * norm) + dv * c)
             + seq * dv * c, f"{sampled} sampled positions of {seq}"),
        Term(f"activations: decoder layer x 1 pass over {sampled} positions", sampled * per_token),
        Term("activations: final norm + loss", sampled * (2 * h * norm + 2 * dv * loss)),
        Term(f"attention score term ({attn_impl}), S x S", sampled * sampled * score if score
             else sampled * heads * 4),
    ]
    score_grads = 2 * heads * sampled * sampled * 4 if attn_impl == "eager" else 0
    return terms, max(sampled * dv * (c + 3 * loss), score_grads)


def _dflash_activations(draft: DraftConfig, seq: int, attn_impl: str, device_type: str) -> tuple[list[Term], int]:
    """DFlash's one forward over Q = anchors x block query tokens (eagle3.arch.draft.dflash_anchors) against
    T + Q keys (fc over the T aux states, then the blocks): per query token, each layer as a later EAGLE-3 layer
    keeps it with its Qwen3 q/k norms; per key token and layer, the concatenated keys and values, k after its
    norm and rotary (4 x kv*head_dim); once over T, fc's output and its hidden_norm; the targets and the loss over
    Q; the Q x (T + Q) score term (sdpa: its bool mask, the fused kernel keeps no probabilities; eager:
    speculators' float mask and the softmax; flex: log-sum-exp only). Checked against the measured peak
    on CPU (bench/plan_memory.py --kind dflash); no gradient checkpointing (refused for dflash)."""
    h, n_aux, dv, heads = draft.hidden_size, len(draft.aux_layer_ids), draft.draft_vocab_size, draft.num_attention_heads
    kvd, qd, inter = draft.num_key_value_heads * draft.head_dim, heads * draft.head_dim, draft.intermediate_size
    cuda = device_type == "cuda"
    c, norm, loss = (2, 6, 2) if cuda else (4, 4, 4)
    block = block_size(draft)
    q = dflash_anchors(block, seq) * block
    kv, n = seq + q, draft.num_layers
    per_query = n * ((3 * qd + 4 * h + 4 * inter) * c + 2 * h * norm + (qd + kvd) * norm) + h * c
    score = n * {"eager": c + heads * (4 + (2 if cuda else 0)), "sdpa": 1}.get(attn_impl, 0)
    terms = [
        Term("activations: fc over the aux states + hidden_norm", seq * (n_aux * h * c + h * (c + norm)),
             f"T = {seq}"),
        Term(f"activations: decoder layer x 1 pass over {q} block tokens", q * per_query + kv * n * 4 * kvd * c,
             f"{q // block} anchors x block {block}; keys and values over T + Q"),
        Term("activations: targets, final norm + loss", q * (dv * c + 2 * h * norm + 2 * dv * loss)),
        Term(f"attention score term ({attn_impl}), Q x (T + Q)", q * kv * score if score else q * heads * 4),
    ]
    score_grads = 2 * heads * q * kv * 4 if attn_impl == "eager" else 0
    return terms, max(q * dv * (c + 3 * loss), score_grads)


def hidden_buffers(draft: DraftConfig, data: DataConfig, device_type: str, ring: int | None) -> list[Term]:
    """What one micro-batch's hidden states take: `ring` buffers (the reader's prefetch + 1) in host memory and one
    on the device for hidden states read from files (eagle3/data/reader.py, train.to_device); `ring=None` for those
    the verifier computes in the loop (eagle3/data/online.py OnlineLoader): one buffer per loader on the device."""
    h, slots, t = draft.hidden_size, len(draft.aux_layer_ids) + 1, data.total_seq_len
    dtype = data.hidden_states_dtype.value
    file_bytes = DTYPE_BYTES[dtype]
    one = (t + 1) * slots * h * file_bytes
    cuda = device_type == "cuda"
    if ring is None:
        # The train and the val loader each allocate theirs once and keep it (refilled at every micro-batch).
        terms = [Term(f"online hidden-state buffers: 2 x (T+1) x {slots} x H ({dtype})", 2 * one,
                      "train and val loader, one each, on the device")]
    else:
        terms = [Term(f"hidden-state ring: {ring} x (T+1) x {slots} x H ({dtype})", ring * one,
                      "host, page-locked" if cuda else "host", on_device=not cuda)]
        if cuda:
            terms.append(Term("hidden states on the device (one micro-batch)", one))
    if cuda:
        if file_bytes != 2:
            terms.append(Term("hidden states cast to bf16", t * slots * h * 2))
    else:
        terms.append(Term("hidden states cast to fp32 (one micro-batch)", t * slots * h * 4))
    return terms


# The plan's terms for a verifier the training process loads beside the draft with offline data: eval.accept's on
# rank 0, or on-policy rollouts' in every rank (which eval.accept then reuses).
ACCEPT_VERIFIER = "verifier in the training process (rank 0)"
ROLLOUT_VERIFIER = "verifier for on-policy rollouts (every rank)"


def verifier_bytes_per_param(device_type: str) -> int:
    """data=online loads the verifier in bf16 on CUDA, fp32 on CPU (eagle3/data/online.py load_online_verifier)."""
    return 2 if device_type == "cuda" else 4


def verifier_terms(verifier: VerifierShape, draft: DraftConfig, data: DataConfig, world: int, device_type: str,
                   sharded: bool) -> list[Term]:
    """What data=online's verifier holds on each rank: its weights (a full copy, or with `sharded` 1/world of them
    plus what FSDP2 gathers), and its forward over one micro-batch (no grad, decoder only, no KV cache)."""
    b = verifier_bytes_per_param(device_type)
    dtype = "bf16" if b == 2 else "fp32"
    if not sharded:
        terms = [Term(f"verifier weights ({_count(verifier.params)} params, {dtype}), a full copy per rank",
                      verifier.params * b, "data=online" + (", data.shard_verifier=false" if world > 1 else ""))]
    else:
        kept = verifier.params - verifier.lm_head  # the sharded verifier drops its lm_head
        terms = [
            Term(f"verifier weights ({_count(kept)} params without lm_head, {dtype}), sharded over {world}",
                 math.ceil(kept / world) * b, "data.shard_verifier=true"),
            # The root (embedding + final norm) is sharded with reshard_after_forward=True: gathered while it runs.
            Term("verifier embedding + final norm, all-gathered (FSDP2 root)", verifier.embedding * b,
                 "during its forward", phase=VERIFIER_FORWARD),
            # The layer running and the next one, whose all-gather FSDP2 issues ahead (implicit prefetch).
            Term("verifier decoder layers all-gathered: 2 x the largest", 2 * verifier.layer_params * b,
                 "during its forward", phase=VERIFIER_FORWARD),
            # load_online_verifier loads the whole model into host memory, then shards it layer by layer.
            Term("verifier loaded whole before sharding (each rank's process)", verifier.params * b,
                 "host, at start-up", on_device=False),
        ]
    h, tokens, slots = verifier.hidden_size, data.total_seq_len + 1, len(draft.aux_layer_ids) + 1
    # Per token, no autograd, one layer at a time. While the decoder runs: the captured hidden states (the taps hold
    # each aux layer's input; the residual stream is the latest of them), the layer's normed input, and the larger of
    # the attention's working set (q, its rotary copy, the attention output; k, v, k's rotary copy; o_proj's output)
    # and the MLP's (act(gate), up, their product). After it: the taps and their stack [T+1, slots, H].
    attention = 3 * verifier.q_dim + verifier.kv_dim + verifier.kv_dim // 2 + h
    running = slots * h + h + max(attention, 3 * verifier.mlp_width)
    terms += [
        Term(f"verifier forward: {slots} captured hidden states + one layer's attention/MLP working set",
             tokens * max(running, 2 * slots * h) * b, "(T+1) tokens in the verifier's dtype, packed in one row",
             phase=VERIFIER_FORWARD),
        # packed_batch's per-document causal mask over the packed row, [1, 1, L, L] bool.
        Term("verifier forward: per-document causal mask, (T+1)^2 bool", tokens * tokens,
             "the fused attention kernels keep no score matrix", phase=VERIFIER_FORWARD),
    ]
    return terms


Shape = tuple  # a kernel eagle3.plan.roofline times: ("mm", m, k, n), ("sdpa", T, heads, head_dim, keys, backward),
# ("loss", T, vocab)


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


def step_flops(draft: DraftConfig, seq: int, train_lm_head: bool, checkpointing: bool,
               attn_impl: str = "sdpa") -> float:
    """Matrix-multiply FLOPs of one micro-batch (step_matmuls; the loss's logits are no FLOPs)."""
    return sum(m.flops for m in step_matmuls(draft, seq, train_lm_head, checkpointing, attn_impl)
               if m.shape[0] != "loss")


def matmul_seconds(matmuls: list[Matmul], rates: dict[Shape, float]) -> float | None:
    """Seconds of `matmuls` at the measured `rates` of their shapes; None when a shape has no rate."""
    if not all(m.shape in rates for m in matmuls if m.flops):
        return None
    return sum(m.flops / rates[m.shape] for m in matmuls if m.flops)


def make_plan(draft: DraftConfig, data: DataConfig, optim: OptimConfig, dist: DistributedConfig, *,
              device_type: str, device_memory: int | None, device_memory_source: str, data_terms: list[Term],
              train_lm_head: bool = False, data_stats: DataStats | None = None, no_rows_reason: str = "",
              hidden_cache_bytes: int = 0, loaded_verifier: Term | None = None,
              online_verifier: VerifierShape | None = None,
              matmul_rates: Callable[[list[Shape]], tuple[dict[Shape, float], str]] | None = None) -> Plan:
    """The per-rank memory terms and the time per optimizer step of a run with these config parts.
    `loaded_verifier`: the term of the verifier the training process loads with offline data (ACCEPT_VERIFIER or
    ROLLOUT_VERIFIER); `online_verifier`: the one data=online runs in every rank (eval.accept and the rollouts then
    reuse it: counted once). `hidden_cache_bytes`: the run dir's disk for hidden states computed in the loop (the
    source's Source.hidden_cache_bytes: data.cache_gb). `matmul_rates`: this machine's measured matrix-multiply
    rates (FLOP/s) at the step's shapes, and where they came from (eagle3.plan.roofline.rates_for); without them, or
    for a shape it has no rate of, the step time assumes a share of the device's peak."""
    world, strategy, gradient_checkpointing = dist.world_size, dist.strategy.value, draft.gradient_checkpointing
    fsdp = strategy == "fsdp" and world > 1
    attn = attn_impl_on(draft.attn_impl, device_type)
    counts = parameter_counts(draft, train_lm_head)
    trainable = sum(n for n, tr in counts.values() if tr)
    frozen = sum(n for n, tr in counts.values() if not tr)
    shard = world if fsdp else 1
    terms = [
        Term(f"parameters, frozen ({_count(frozen)}, fp32)", 4 * frozen // shard,
             f"sharded over {world}" if fsdp else "replicated"),
        Term(f"parameters, trainable ({_count(trainable)}, fp32)", 4 * trainable // shard,
             f"sharded over {world}" if fsdp else "replicated"),
        Term("buffers d2t/t2d", buffer_bytes(draft)),
        Term("gradients (fp32)", 4 * trainable // shard),
        Term("AdamW state (2 fp32 moments)", 8 * trainable // shard, f"sharded over {world}" if fsdp else ""),
    ]
    if fsdp:
        # FSDP2 all-gathers a group's parameters in the compute dtype; the root group (everything but the
        # decoder layer, the frozen embedding included) stays gathered through forward and backward.
        gathered = 2 if device_type == "cuda" else 4
        terms.append(Term("FSDP all-gathered parameters (root + layer)", gathered * (trainable + frozen),
                          "compute dtype, during forward/backward"))
    elif world > 1:
        terms.append(Term("DDP gradient buckets", 4 * trainable, "a second copy of the gradients"))
    terms += data_terms  # the data source's hidden-state buffers (eagle3.data.sources: buffer_terms)
    act_terms, transient = _activations(draft, data.total_seq_len, attn, device_type, gradient_checkpointing)
    terms += act_terms
    terms.append(Term("largest transient of the backward", transient))
    for term in act_terms + terms[-1:]:
        term.phase = DRAFT_STEP
    online = online_verifier if data.verifier_in_rank() else None
    # With one rank load_online_verifier keeps a full copy whatever data.shard_verifier says.
    sharded = data.verifier_in_rank() == "sharded" and world > 1
    if online is not None:
        terms += verifier_terms(online, draft, data, world, device_type, sharded)
    elif loaded_verifier is not None:
        terms.append(loaded_verifier)

    tokens_per_step = data.total_seq_len * optim.grad_accum * world
    matmuls = step_matmuls(draft, data.total_seq_len, train_lm_head, gradient_checkpointing, attn)
    verifier_mm = verifier_matmuls(online, data.total_seq_len) if online is not None else []
    flops = sum(m.flops for m in matmuls if m.shape[0] != "loss") * optim.grad_accum
    forward_flops = sum(m.flops for m in verifier_mm) * optim.grad_accum
    rates, rate_source = matmul_rates([m.shape for m in matmuls + verifier_mm]) if matmul_rates else ({}, "")
    measured = matmul_seconds(matmuls + verifier_mm, rates)
    if measured is not None:
        step_seconds = measured * optim.grad_accum
        rate_note = f"at this machine's kernel rates at the step's shapes, {rate_source}"
    else:
        step_seconds = (flops + forward_flops) / (PEAK_FLOPS[device_type] * UTILIZATION)
        peak_name = "dense bf16 peak of an H100/H200" if device_type == "cuda" else "a rough CPU figure"
        rate_note = (f"at an assumed {UTILIZATION:.0%} of {PEAK_FLOPS[device_type] / 1e12:g} TFLOP/s, {peak_name}; "
                     f"{rate_source or 'no measured rate'}")
    plan = Plan(device_type=device_type, world_size=world, strategy=strategy if world > 1 else "single",
                attn_impl=attn, gradient_checkpointing=gradient_checkpointing, terms=terms,
                trainable_params=trainable, frozen_params=frozen,
                tokens_per_step=tokens_per_step, flops_per_step=flops + forward_flops, step_seconds=step_seconds,
                device_memory=device_memory, device_memory_source=device_memory_source,
                verifier_flops_per_step=forward_flops, rate_note=rate_note)
    if online is not None:
        plan.online_verifier = "sharded" if sharded else "full"
        plan.verifier_bytes = _verifier_weight_bytes(terms)
        if not sharded and world > 1:
            plan.verifier_if_sharded = _verifier_weight_bytes(verifier_terms(online, draft, data, world, device_type,
                                                                             True))
    _add_data_notes(plan, draft, data, optim, data_stats, no_rows_reason, hidden_cache_bytes)
    return plan


def _add_data_notes(plan: Plan, draft: DraftConfig, data: DataConfig, optim: OptimConfig,
                    data_stats: DataStats | None, no_rows_reason: str, cache_budget: int) -> None:
    """The plan's steps per epoch and in the run (when the rows are counted), and its notes on the dataset and its
    hidden states on disk (`cache_budget`: what the run may keep of them in its run dir)."""
    slots = len(draft.aux_layer_ids) + 1
    offline_per_token = slots * draft.hidden_size * DTYPE_BYTES[data.hidden_states_dtype.value]
    offline_formula = f"{slots} x H x {data.hidden_states_dtype.value}"
    if data_stats is not None:
        if data_stats.train_lengths is not None:
            from eagle3.formats.packing import steps_per_epoch

            replicas = plan.tokens_per_step // data.total_seq_len
            plan.steps_per_epoch = steps_per_epoch(data_stats.train_lengths, data.total_seq_len, replicas)
        else:
            plan.steps_per_epoch = max(1, math.ceil(data_stats.train_tokens / plan.tokens_per_step))
        plan.total_steps = plan.steps_per_epoch * optim.epochs
        if optim.max_steps is not None:
            plan.total_steps = min(plan.total_steps, optim.max_steps)
        plan.data_notes = [f"dataset: {data_stats.train_rows} train rows, {data_stats.train_tokens:,} train tokens "
                           f"of {data_stats.total_tokens:,}"]
        if data.verifier_in_rank():
            offline = data_stats.total_tokens * offline_per_token
            plan.data_notes.append(f"hidden states on disk: none (data=online computes them in the loop); offline "
                                   f"data would store {offline_per_token:,} bytes/token ({offline_formula}), "
                                   f"{offline / GIB:.2f} GiB for these tokens")
            if cache_budget:
                train = data_stats.train_tokens * offline_per_token
                kept = min(train, cache_budget)
                plan.data_notes.append(
                    f"data.cache_gb={cache_budget / 1e9:g}: the train rows' hidden states kept in the run dir for the "
                    f"epochs after the first, {kept / GIB:.2f} GiB on disk while the run lasts "
                    f"({100 * kept / max(1, train):.0f}% of the train tokens' {train / GIB:.2f} GiB; the rest runs "
                    f"the verifier at every epoch)" + ("" if optim.epochs > 1 else
                                                       "; optim.epochs=1 never reads them back"))
        else:
            per_token = data_stats.hidden_bytes_on_disk / max(1, data_stats.total_tokens)
            plan.data_notes.append(f"hidden states on disk: {per_token:,.0f} bytes/token, "
                                   f"{data_stats.hidden_bytes_on_disk / GIB:.2f} GiB in all")
    else:
        one_b = f"1 B tokens = {offline_per_token * 1e9 / 1024 ** 4:.1f} TiB"
        plan.data_notes = [f"{no_rows_reason or 'no data rows to count (no dataset yet)'}: per-step figures only"]
        if data.verifier_in_rank():
            plan.data_notes.append(f"hidden states on disk: none (data=online computes them in the loop); offline "
                                   f"data would store {offline_per_token:,} bytes/token ({offline_formula}): {one_b}")
            if cache_budget:
                plan.data_notes.append(f"data.cache_gb={cache_budget / 1e9:g}: up to that much disk "
                                       f"in the run dir for the train rows' hidden states ({offline_per_token:,} "
                                       f"bytes/token), read back by the epochs after the first")
        else:
            plan.data_notes.append(f"hidden states on disk: {offline_per_token:,} bytes/token ({offline_formula}); "
                                   f"{one_b}")


def _verifier_weight_bytes(terms: list[Term]) -> int:
    """The device bytes of the online verifier's weights among `terms`, gathered parts included, activations not."""
    return sum(t.bytes for t in terms if t.on_device and t.name.startswith("verifier ") and " forward:" not in t.name)


def check_fits(plan: Plan) -> None:
    """Raises ConfigError naming the largest term and the knobs that shrink it when the peak does not fit. With
    data=online the verifier in every rank comes first: shard it over the ranks, or go offline."""
    if plan.device_memory is None or plan.fits():
        return
    big = plan.largest
    limit = FIT_SHARE * plan.device_memory
    # Only the knobs this config has not turned already.
    knobs = ["a smaller data.total_seq_len with a larger optim.grad_accum (same global batch)"]
    if plan.strategy != "fsdp":
        knobs.append("distributed=fsdp (shards parameters, gradients and AdamW state over the ranks)")
    if not plan.gradient_checkpointing:
        knobs.append("model.draft.gradient_checkpointing=true (recomputes the decoder layer in the backward)")
    if plan.attn_impl in ("eager", "sdpa"):
        knobs.append("model.draft.attn_impl=simple_flex_attention (no T x T score or mask matrix; CUDA only)")
    head = (f"this run needs about {human(plan.peak)} per rank, over {FIT_SHARE:.0%} of the device's "
            f"{human(plan.device_memory)} ({plan.device_memory_source})")
    tail = "The whole plan: python launch.py plan=true <your overrides>"
    if plan.online_verifier is not None:
        offline = ("offline data: the hidden states prepared once, with no verifier in the training ranks "
                   "(python -m eagle3.data.prepare, or speculators' vLLM pipeline for a verifier that needs a "
                   "serving engine; then data=offline data.path=<that dataset>)")
        if plan.verifier_if_sharded is not None:
            fix = [f"data.shard_verifier=true (its weights divided over the {plan.world_size} ranks: about "
                   f"{human(plan.verifier_if_sharded)} per rank)", offline]
        elif plan.online_verifier == "full":  # one rank: sharding needs more of them
            fix = ["data.shard_verifier=true over more ranks (distributed=ddp distributed.nproc_per_node=N)",
                   offline]
        else:
            fix = ["more ranks to shard it over (distributed.nproc_per_node, distributed.nnodes)", offline]
        copy = "its share, sharded" if plan.online_verifier == "sharded" else "a full copy"
        verifier = f"the verifier data=online holds in every rank takes {human(plan.verifier_bytes)} of it ({copy})"
        if plan.verifier_bytes > limit:  # the draft's knobs cannot help
            raise ConfigError(f"{head}; {verifier}, more than the device holds. Instead: {' or '.join(fix)}. {tail}")
        raise ConfigError(f"{head}; {verifier}; the largest term is {big.name}: {human(big.bytes)}. To shrink it: "
                          f"{'; '.join(fix + knobs)}. {tail}")
    without = {ACCEPT_VERIFIER: "eval.accept.enabled=false (measured acceptance loads the whole verifier on rank 0 "
                                "beside the draft; measure it after the run with python -m eagle3.eval.accept --run "
                                "<run dir>, where the verifier fits)",
               ROLLOUT_VERIFIER: "train.on_policy.enabled=false (its rollouts hold the whole verifier in every rank)"}
    if big.name in without:
        if big.bytes > limit:  # the draft's knobs cannot help
            raise ConfigError(f"{head}; the {big.name} takes {human(big.bytes)} of it, more than the device holds. "
                              f"Instead: {without[big.name]}. {tail}")
        knobs.insert(0, without[big.name])
    raise ConfigError(f"{head}; the largest term is {big.name}: {human(big.bytes)}. To shrink it: "
                      f"{'; '.join(knobs)}. {tail}")


def human(n: float) -> str:
    """Bytes as GiB, or MiB below one GiB."""
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2 ** 20:.1f} MiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.3f} B" if n >= 1e8 else f"{n / 1e6:.3f} M"


def format_plan(plan: Plan) -> str:
    lines = [f"plan per rank: {plan.world_size} rank(s), {plan.strategy}, {plan.device_type}, "
             f"attention {plan.attn_impl}",
             f"  parameters: {plan.trainable_params:,} trainable, {plan.frozen_params:,} frozen"]
    width = max(len(t.name) for t in plan.terms)
    unit, scale = ("GiB", GIB) if plan.peak >= GIB else ("MiB", 2 ** 20)
    phases = plan.phase_bytes()
    for t in plan.terms:
        where = "" if t.on_device else "  [host]"
        if t.phase and len(phases) > 1:
            where += f"  [{t.phase}]"
        lines.append(f"  {t.name:<{width}}  {t.bytes / scale:9.3f} {unit}{where}{'  ' + t.note if t.note else ''}")
    if len(phases) > 1:
        larger = max(phases, key=lambda p: phases[p])
        lines.append(f"  (the verifier's forward and the draft's step run one after the other: the peak counts the "
                     f"larger, {larger}; " + ", ".join(f"{p} {b / scale:.3f} {unit}" for p, b in phases.items()) + ")")
    lines.append(f"  {'peak on the device':<{width}}  {plan.peak / scale:9.3f} {unit}  (largest: {plan.largest.name})")
    if plan.device_memory is None:
        lines.append(f"  device memory: {plan.device_memory_source}")
    else:
        share = plan.peak / plan.device_memory
        verdict = "fits" if plan.fits() else f"DOES NOT FIT (limit {FIT_SHARE:.0%}; exit status {NO_FIT_STATUS})"
        lines.append(f"  device memory: {human(plan.device_memory)} ({plan.device_memory_source}): "
                     f"{share:.0%} used, {verdict}")
    lines.append(f"  tokens per optimizer step: {plan.tokens_per_step:,} (total_seq_len x grad_accum x ranks)")
    lines.append(f"  step time: about {plan.step_seconds:.2f} s ({plan.flops_per_step / 1e12:.3g} TFLOP per rank, "
                 f"{plan.flops_per_step / plan.step_seconds / 1e12:.3g} TFLOP/s, {plan.rate_note})")
    if plan.verifier_flops_per_step:
        lines.append(f"    of which the verifier's forward (data=online): "
                     f"{plan.verifier_flops_per_step / 1e12:.3g} TFLOP")
    if plan.steps_per_epoch is not None and plan.total_steps is not None:
        hours = plan.total_steps * plan.step_seconds / 3600
        lines.append(f"  steps: {plan.steps_per_epoch:,} per epoch (the rows packed as the run packs them), "
                     f"{plan.total_steps:,} in the run, about {hours:.1f} h")
    lines += [f"  {note}" for note in plan.data_notes]
    return "\n".join(lines)
