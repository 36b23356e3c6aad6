"""The memory and time plan of a run, per rank, computed from the config alone (`eagle3 plan`).

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

from eagle3.arch.draft import block_size, dflash_anchors, layer_step_elements, parameter_counts, sampled_share
from eagle3.config import DataConfig, DraftConfig, DraftKind
from eagle3.device.choice import attn_impl_on
from eagle3.plan.parts import (
    DRAFT_STEP,
    DTYPE_BYTES,
    VERIFIER_FORWARD,
    Machine,
    Plan,
    PlannedRun,
    SourceFacts,
    Term,
    Verifiers,
    VerifierShape,
)
from eagle3.plan.report import add_data_notes, short_count, verifier_weight_bytes
from eagle3.plan.step_time import step_time


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
    h, steps, layers = draft.hidden_size, draft.ttt_steps, draft.num_layers
    kvd = draft.num_key_value_heads * draft.head_dim
    c, norm, loss, cache_kv, layer_step, outside_step, tri, score_bytes, ttt_path, score_name, first = \
        _step_sizes(draft, attn_impl, device_type)
    terms = [Term("activations: input norm + targets", seq * first, "before the TTT steps")]
    if not checkpointing:
        terms += [Term(f"activations: decoder layer x {steps} TTT steps", seq * (steps * layer_step + cache_kv * c),
                       "incl. the keys/values each step's attention keeps"),
                  Term(f"activations: final norm + loss x {steps}", seq * steps * outside_step)]
        if ttt_path or not score_name:
            terms.append(_score_term(draft, seq, attn_impl, c))
        else:
            terms.append(Term(f"attention score term ({attn_impl}): {score_name}", seq * seq * tri * score_bytes,
                              f"{'heads x ' if attn_impl == 'eager' else ''}T^2 x {tri} x bytes"))
    else:
        # The checkpoint keeps each step's layer input (2H) and the earlier steps' keys/values (its inputs);
        # sdpa/eager masks stay alive in the recompute's closure; one step's layer lives again in the backward.
        past_kv = layers * 2 * kvd * (steps - 1) * steps // 2
        terms += [Term(f"activations: layer inputs + cache x {steps} TTT steps (checkpointed)",
                       seq * (steps * (2 * h + (layers - 1) * h) * c + past_kv * c)),
                  Term(f"activations: final norm + loss x {steps}", seq * steps * outside_step)]
        if score_name:
            # speculators' masks as built: bool for sdpa (converted to the compute dtype inside the kernel
            # call), additive float for eager.
            mask_bytes = 1 if attn_impl == "sdpa" else c
            terms.append(Term(f"attention masks ({attn_impl}, kept for the recompute)",
                              seq * seq * tri * mask_bytes, "T^2 x sum(t+1) x bytes"))
        recompute = seq * (layer_step_elements(draft, c, norm, layers=1) + 2 * kvd * steps * c)  # the widest layer
        if score_name and not ttt_path:  # the last step's score matrix (eager) or converted mask (sdpa), alive again
            recompute += seq * seq * steps * score_bytes // layers
    # The largest transient: the last step's loss working set (logits, log-probs, probs, elementwise loss),
    # or eager attention's score gradients (two of the last step's score matrices).
    loss_transient = seq * draft.draft_vocab_size * (c + 3 * loss)
    score_grads = 2 * draft.num_attention_heads * seq * seq * steps * 4 if attn_impl == "eager" else 0
    transient = max(loss_transient, score_grads)
    if checkpointing:
        # The last step's layer is recomputed after its loss and final norm were backwarded (freed); the peak
        # is the larger of that and the forward's loss transient.
        recompute = max(0, recompute - seq * outside_step)
        terms.append(Term("recomputed layer (last TTT step, in the backward)", recompute))
        transient = max(loss_transient - recompute, score_grads)
    return terms, transient


def _step_sizes(draft: DraftConfig, attn_impl: str, device_type: str) -> tuple:
    """The sizes _activations counts with: the compute dtype's bytes (c), a norm's saved elements, the loss's bytes, the
    cache's keys and values, a TTT step's elements per token in the layers and outside them, sum(t + 1), the score
    term's bytes per layer, whether sdpa takes the TTT path, the score term's name, and the elements before the
    steps."""
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

    return (c, norm, loss, cache_kv, layer_step, outside_step, tri, score_bytes, ttt_path, score_name, first)


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


def _peagle_activations(draft: DraftConfig, seq: int, attn_impl: str, device_type: str,
                        checkpointing: bool) -> tuple[list[Term], int]:
    """P-EAGLE's one forward over the S COD-sampled positions (S = T x eagle3.arch.draft.sampled_share): the per-token
    terms of one EAGLE-3 step (its layer's keys and values included) at S tokens instead of k x T, the targets
    over T and their S gathered rows, and one S x S score term (sdpa: speculators' float mask; eager: the
    softmax per head; flex: log-sum-exp only). Checked against the measured peak on CPU (bench/plan_memory.py
    --kind peagle); gradient checkpointing is not modelled for it (`checkpointing` is not read)."""
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


def _dflash_activations(draft: DraftConfig, seq: int, attn_impl: str, device_type: str,
                        checkpointing: bool) -> tuple[list[Term], int]:
    """DFlash's one forward over Q = anchors x block query tokens (eagle3.arch.draft.dflash_anchors) against
    T + Q keys (fc over the T aux states, then the blocks): per query token, each layer as a later EAGLE-3 layer
    keeps it with its Qwen3 q/k norms; per key token and layer, the concatenated keys and values, k after its
    norm and rotary (4 x kv*head_dim); once over T, fc's output and its hidden_norm; the targets and the loss over
    Q; the Q x (T + Q) score term (sdpa: its bool mask, the fused kernel keeps no probabilities; eager:
    speculators' float mask and the softmax; flex: log-sum-exp only). Checked against the measured peak
    on CPU (bench/plan_memory.py --kind dflash); no gradient checkpointing (refused for dflash: `checkpointing`
    is not read)."""
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
        terms = [Term(f"verifier weights ({short_count(verifier.params)} params, {dtype}), a full copy per rank",
                      verifier.params * b, "data=online" + (", data.shard_verifier=false" if world > 1 else ""))]
    else:
        kept = verifier.params - verifier.lm_head  # the sharded verifier drops its lm_head
        terms = [
            Term(f"verifier weights ({short_count(kept)} params without lm_head, {dtype}), sharded over {world}",
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


# The kinds that draft in one pass (P-EAGLE over its sampled positions, DFlash over its anchor blocks); EAGLE-3's
# TTT steps are _activations'.
ONE_PASS_ACTIVATIONS = {DraftKind.peagle: _peagle_activations, DraftKind.dflash: _dflash_activations}


def make_plan(run: PlannedRun, machine: Machine, source: SourceFacts, verifiers: Verifiers | None = None
              ) -> Plan:
    """The per-rank memory terms and the time per optimizer step of `run` on `machine`, with the data source's
    buffers and counts and the verifiers a rank holds besides the draft (eagle3/plan/parts.py says what each holds)."""
    draft, data, optim, dist, train_lm_head = run.draft, run.data, run.optim, run.dist, run.train_lm_head
    device_type, verifiers = machine.device_type, verifiers or Verifiers()
    world, strategy, gradient_checkpointing = dist.world_size, dist.strategy.value, draft.gradient_checkpointing
    fsdp = strategy == "fsdp" and world > 1
    attn = attn_impl_on(draft.attn_impl, device_type)
    counts = parameter_counts(draft, train_lm_head)
    trainable = sum(n for n, tr in counts.values() if tr)
    frozen = sum(n for n, tr in counts.values() if not tr)
    shard = world if fsdp else 1
    terms = [
        Term(f"parameters, frozen ({short_count(frozen)}, fp32)", 4 * frozen // shard,
             f"sharded over {world}" if fsdp else "replicated"),
        Term(f"parameters, trainable ({short_count(trainable)}, fp32)", 4 * trainable // shard,
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
    terms += source.terms  # the data source's hidden-state buffers (eagle3.data.sources: buffer_terms)
    activations = ONE_PASS_ACTIVATIONS.get(draft.kind, _activations)
    act_terms, transient = activations(draft, data.total_seq_len, attn, device_type, gradient_checkpointing)
    terms += act_terms
    terms.append(Term("largest transient of the backward", transient))
    for term in act_terms + terms[-1:]:
        term.phase = DRAFT_STEP
    online = verifiers.online if data.verifier_in_rank() else None
    # With one rank load_online_verifier keeps a full copy whatever data.shard_verifier says.
    sharded = data.verifier_in_rank() == "sharded" and world > 1
    if online is not None:
        terms += verifier_terms(online, draft, data, world, device_type, sharded)
    elif verifiers.loaded is not None:
        terms.append(verifiers.loaded)
    time = step_time(run, machine, attn, online)
    plan = Plan(device_type=device_type, world_size=world, strategy=strategy if world > 1 else "single",
                attn_impl=attn, gradient_checkpointing=gradient_checkpointing, terms=terms,
                trainable_params=trainable, frozen_params=frozen,
                tokens_per_step=data.total_seq_len * optim.grad_accum * world,
                flops_per_step=time.flops + time.verifier_flops, step_seconds=time.seconds,
                device_memory=machine.device_memory, device_memory_source=machine.device_memory_source,
                verifier_flops_per_step=time.verifier_flops, rate_note=time.rate_note)
    if online is not None:
        plan.online_verifier = "sharded" if sharded else "full"
        plan.verifier_bytes = verifier_weight_bytes(terms)
        if not sharded and world > 1:
            plan.verifier_if_sharded = verifier_weight_bytes(verifier_terms(online, draft, data, world, device_type,
                                                                             True))
    add_data_notes(plan, draft, data, optim, source)
    return plan
