"""This machine's matmul rate at a config's shapes (the roofline), and the plan's step time against a measured one.

    python bench/roofline.py                                   # the tiny default
    python bench/roofline.py model=auto model.verifier.path=<SmolLM2 dir> model.draft.draft_vocab_size=8192 \\
        data=online data.total_seq_len=1024                   # any launch.py overrides
    python bench/roofline.py --offline ...                    # time the step without the verifier's forward

1. Measures torch.mm (fp32, and bf16 beside it) at every matrix-multiply shape the plan counts for the config
   (eagle3.plan.memory.step_matmuls, verifier_matmuls), each for `--seconds`, and stores the fp32 rates in this
   machine's cache (eagle3.plan.roofline: `plan=true` then uses them and names them as its source).
2. Prints the plan's step time from those rates, and times the trainer's own step (eagle3.train.loop.train_step: the
   draft's forward, backward, clipping and AdamW) on random hidden states of the config's shapes, with data=online
   the verifier's forward over each micro-batch too, `--steps` steps after a warmup; prints measured / predicted,
   the achieved FLOP rate against the measured matmul rate, and where a step's time went (verifier forward, draft
   forward, backward, optimizer), each phase timed with the same batches.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

from common import tiny_run_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="launch.py overrides (key=value)")
    parser.add_argument("--seconds", type=float, default=0.3, help="time spent per shape and dtype")
    parser.add_argument("--steps", type=int, default=5, help="timed training steps")
    parser.add_argument("--offline", action="store_true", help="no verifier forward even with data=online")
    args = parser.parse_args()

    import torch

    from eagle3.console import quiet_libraries
    from eagle3.plan.roofline import Rates, machine_key, measure, shape_key
    from eagle3.plan.sizes import verifier_shape
    from eagle3.plan.step_time import matmul_seconds, step_matmuls, verifier_matmuls

    quiet_libraries()
    cfg = tiny_run_config(["device=cpu", *args.overrides])
    draft, seq = cfg.model.draft, cfg.data.total_seq_len
    online = cfg.data.verifier_in_rank() is not None and not args.offline
    matmuls = step_matmuls(draft, seq, False, draft.gradient_checkpointing, "sdpa")
    if online:
        matmuls += verifier_matmuls(verifier_shape(cfg.model.verifier), seq)
    shapes = list(dict.fromkeys(m.shape for m in matmuls))
    key = machine_key("cpu")
    print(f"machine: {key}")
    fp32 = measure(shapes, seconds=args.seconds)
    # bf16 where the device computes it natively: a probe first (a CPU without bf16 instructions emulates it,
    # tens of times slower, and the step's shapes would take minutes)
    probe = ("mm", 256, 256, 256)
    bf16_probe = measure([probe], dtype="bfloat16", seconds=0.05)[shape_key(probe, "bfloat16")]
    fp32_probe = measure([probe], seconds=0.05)[shape_key(probe)]
    print(f"bf16 probe at 256^3: {bf16_probe / 1e9:.1f} GFLOP/s, fp32 {fp32_probe / 1e9:.1f}")
    mm_shapes = [s for s in shapes if s[0] == "mm"]
    bf16 = measure(mm_shapes, dtype="bfloat16", seconds=args.seconds) if bf16_probe > 0.5 * fp32_probe else {}
    cache = Rates.load(cfg.cache_dir, key)
    cache.merge(fp32)
    cache.save()
    print(f"{'kernel':<24} {'fp32 GFLOP/s':>12} {'bf16 GFLOP/s':>12}  used by  (loss: G logits/s)")
    for shape in shapes:
        users = ", ".join(m.name for m in matmuls if m.shape == shape)
        b = bf16.get(shape_key(shape, "bfloat16"))
        print(f"{'x'.join(map(str, shape)):<24} {fp32[shape_key(shape)] / 1e9:12.1f} "
              f"{b / 1e9 if b else float('nan'):12.1f}  {users}")
    print(f"cached in {cache.file}")

    # What make_plan computes (eagle3.plan.memory.matmul_seconds over these shapes at the cached rates), for this step
    # with or without the verifier's forward.
    rates = {shape: fp32[shape_key(shape)] for shape in shapes}
    planned = matmul_seconds(matmuls, rates) * cfg.optim.grad_accum
    flops = sum(m.flops for m in matmuls if m.shape[0] != "loss") * cfg.optim.grad_accum
    verifier_flops = sum(m.flops for m in matmuls if m.name.startswith("verifier")) * cfg.optim.grad_accum
    print(f"plan: {planned:.3f} s per step, {flops / 1e12:.4g} TFLOP ({verifier_flops / 1e12:.4g} of them the "
          f"verifier's forward), {flops / planned / 1e9:.1f} GFLOP/s at the measured rates")

    # Side by side: before each timed step, the step's kernels again (one call each), so that each step's planned
    # time is computed from rates measured under the same load; the ratio is the median of the per-step ratios.
    def plan_now() -> float:
        now = measure(shapes, seconds=0.0, min_reps=1)
        return matmul_seconds(matmuls, {sh: now[shape_key(sh)] for sh in shapes}) * cfg.optim.grad_accum

    phases = time_steps(cfg, online, args.steps, plan_now)
    step_s = statistics.median(phases["step"])
    print(f"measured: {step_s:.3f} s per step (median of {args.steps}: "
          f"{', '.join(f'{s:.3f}' for s in phases['step'])}), torch threads {torch.get_num_threads()}")
    ratios = [s / p for s, p in zip(phases["step"], phases["planned"])]
    planned_each = ", ".join(f"{p:.3f}" for p in phases["planned"])
    print(f"measured / planned, side by side: {statistics.median(ratios):.2f} (median; per step "
          f"{', '.join(f'{r:.2f}' for r in ratios)}; planned per step {planned_each}); against the rates measured "
          f"first: {step_s / planned:.2f}")
    print(f"achieved: {flops / step_s / 1e9:.1f} GFLOP/s of the plan's FLOPs; the step at "
          f"{statistics.median(p / s for s, p in zip(phases['step'], phases['planned'])):.0%} of its kernels' "
          f"measured rates")
    print("where a step's time went (medians):")
    for name, values in phases.items():
        if name not in ("step", "planned"):
            print(f"  {name:<22} {statistics.median(values):8.3f} s  {statistics.median(values) / step_s:6.1%}")


def time_steps(cfg, online: bool, steps: int, plan_now) -> dict[str, list[float]]:
    """Per step: the whole step as the trainer runs it (eagle3.train.loop.train_step, plus the verifier's forward
    online), then its phases timed apart on the same batch."""
    import torch
    from speculators.losses import resolve_loss_config

    from bench.common import random_draft
    from eagle3.device.distributed import World
    from eagle3.train.loop import StepParts, make_scheduler, train_step

    draft, seq, optim = cfg.model.draft, cfg.data.total_seq_len, cfg.optim
    model = random_draft(draft, "sdpa", std=0.05)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-5)
    scheduler = make_scheduler(optimizer, "constant", 0, 10 ** 9)
    kwargs = {"ttt_steps": draft.ttt_steps, "ttt_step_loss_decay": draft.ttt_step_loss_decay,
              "loss_config": resolve_loss_config(draft.loss, "eager")}
    parts = StepParts(model, optimizer, scheduler, trainable, optim.grad_accum, optim.grad_clip, torch.device("cpu"),
                      nullcontext(), kwargs)
    verifier = None
    if online:
        from eagle3.data.online import load_online_verifier
        from eagle3.run.inputs import materialize_inputs

        verifier_dir = materialize_inputs(cfg)[0] if cfg.model.verifier.path is None else cfg.model.verifier.path
        verifier = load_online_verifier(verifier_dir, draft.aux_layer_ids, torch.device("cpu"), World(), False)
    gen = torch.Generator().manual_seed(1)
    h, n, docs = draft.hidden_size, len(draft.aux_layer_ids), 4

    def batch() -> dict:
        ids = torch.randint(0, draft.vocab_size, (1, seq + 1), generator=gen)
        if verifier is not None:  # the hidden states as data=online gets them: one forward over the row
            hidden = verifier([ids[0]])[0]
            hs, last = hidden[:seq, :-1].reshape(1, seq, n * h), hidden[1:, -1][None]
        else:
            hs, last = torch.randn(1, seq, n * h, generator=gen), torch.randn(1, seq, h, generator=gen)
        return {"hidden_states": hs, "verifier_last_hidden_states": last, "input_ids": ids[:, :seq],
                "loss_mask": torch.ones(1, seq, dtype=torch.long),
                "position_ids": (torch.arange(seq) % (seq // docs) + 1)[None],
                "document_ids": torch.arange(docs).repeat_interleave(seq // docs)[None]}

    phases: dict[str, list[float]] = {"step": [], "planned": [], "verifier forward": [], "draft forward": [],
                                      "draft backward": [], "clip + AdamW": []}
    for i in range(steps + 1):
        planned = plan_now() if i else 0.0
        start = time.perf_counter()
        batches = [batch() for _ in range(optim.grad_accum)]
        train_step(parts, iter(batches), {})
        took = time.perf_counter() - start
        if i == 0:
            continue  # warmup
        phases["step"].append(took)
        phases["planned"].append(planned)
        t0 = time.perf_counter()
        b = batch()
        t1 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        _, loss, _ = model(**b, **kwargs)
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(trainable, optim.grad_clip)
        optimizer.step()
        t4 = time.perf_counter()
        accum = optim.grad_accum
        phases["verifier forward"].append((t1 - t0) * accum if verifier is not None else 0.0)
        phases["draft forward"].append((t2 - t1) * accum)
        phases["draft backward"].append((t3 - t2) * accum)
        phases["clip + AdamW"].append(t4 - t3)
    return phases


if __name__ == "__main__":
    main()
