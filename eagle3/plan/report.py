"""A plan's notes on its data, the check that refuses a run that cannot fit, and the plan as `eagle3 plan` prints it."""

from __future__ import annotations

import math

from eagle3.config import DataConfig, DraftConfig, OptimConfig
from eagle3.errors import ConfigError
from eagle3.plan.parts import (
    ACCEPT_VERIFIER,
    DTYPE_BYTES,
    FIT_SHARE,
    GIB,
    NO_FIT_STATUS,
    ROLLOUT_VERIFIER,
    Plan,
    SourceFacts,
    Term,
)


def add_data_notes(plan: Plan, draft: DraftConfig, data: DataConfig, optim: OptimConfig, source: SourceFacts) -> None:
    """The plan's steps per epoch and in the run (when the rows are counted), and its notes on the dataset and its
    hidden states on disk (the source's hidden_cache_bytes: what the run may keep of them in its run dir)."""
    data_stats, no_rows_reason, cache_budget = source.stats, source.no_rows_reason, source.hidden_cache_bytes
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


def verifier_weight_bytes(terms: list[Term]) -> int:
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
    tail = "The whole plan: eagle3 plan <your overrides>"
    if plan.online_verifier is not None:
        offline = ("offline data: the hidden states prepared once, with no verifier in the training ranks "
                   "(eagle3 prepare, or speculators' vLLM pipeline for a verifier that needs a "
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
                                "beside the draft; measure it after the run with eagle3 accept --run "
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


def short_count(n: int) -> str:
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
