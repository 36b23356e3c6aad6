"""Online data's training loop against its two parts timed apart: what doing both in one loop costs.

    python bench/online.py [--steps 10] [--reps 9] [--warmup 3] [--json out.json] [OVERRIDE ...]
    python bench/online.py --small      # SMALL_DATA-sized rows, in seconds; the test suite runs it

The tiny default with data=online (OVERRIDEs are Hydra's, as launch.py takes them): its verifier, token rows and
draft are built as the launcher and a rank build them (materialize_inputs, load_online_verifier, build_loaders,
build_draft with InitContext), on CUDA when there is one (bf16 verifier, bf16 autocast, fused loss) else on CPU.
Every side runs the same `--steps` optimizer steps over the same micro-batches (the first of epoch 0):

- online: the trainer's loop, eagle3.train.loop.train_step fed by the OnlineLoader (each micro-batch's verifier
  forward, then the draft's forward, backward and optimizer step);
- verifier forward: the OnlineLoader alone (each micro-batch filled: the verifier's forward and the packing);
- train step: train_step alone, on copies of those micro-batches made beforehand.

ratio = online tokens/s / (tokens / (t_verifier_forward + t_train_step)): 1 when one loop costs exactly its two
parts, below 1 by what running them together adds. The verifier's share is t_verifier_forward / (t_verifier_forward
+ t_train_step). Warm-up steps of each side first, then `--reps` reps in which the three sides take turns; on
CUDA the clock stops after torch.cuda.synchronize(). Tokens are real tokens (document_ids >= 0); rates are
medians, the ratio and share are medians of the per-rep values (one rep's sides are adjacent in time, so slow
drifts of a shared machine cancel). Two more estimates of the same ratio follow it, for a machine that other
processes share: from each side's fastest rep (the least disturbed), and on CPU in the process's CPU time (which
they do not take; with several torch threads, a thread that waits spins and is counted).

Then the val split, whose hidden states a run computes once: the second val pass's time over the first's (target
<= 0.15: a later pass costs the draft's forward), and over a pass that computes them again, taken between.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

from common import tiny_run_config

SMALL = ["data.synth.num_samples=128", "data.synth.response_len=48", "data.total_seq_len=512"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="optimizer steps of each side per rep")
    parser.add_argument("--reps", type=int, default=9, help="timed reps of each side")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each side first")
    parser.add_argument("--small", action="store_true", help="fewer, shorter rows and 512-token micro-batches")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the run config (data=online is set)")
    args = parser.parse_args()

    import torch
    from speculators.losses import resolve_loss_config

    from eagle3.console import quiet_libraries
    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.data.online import load_online_verifier
    from eagle3.device.choice import runtime_of
    from eagle3.device.distributed import World
    from eagle3.init import InitContext, build_draft
    from eagle3.run.inputs import materialize_inputs
    from eagle3.train.loop import StepParts, make_scheduler, train_step
    from eagle3.train.rank import micro_batch_len

    quiet_libraries()
    cfg = tiny_run_config(["data=online", *(SMALL if args.small else []), *args.overrides])
    if not cfg.data.verifier_in_rank():
        raise SystemExit(f"bench/online.py measures online data: data={cfg.data.name} is not (drop that override)")
    draft, optim = cfg.model.draft, cfg.optim
    runtime = runtime_of(cfg)
    device, cuda = runtime.device(), runtime.cuda
    verifier_dir, rows_dir = materialize_inputs(cfg)
    world = World()
    # As a rank does it: the verifier first, then the seed, the loaders and the draft.
    verifier = load_online_verifier(verifier_dir, draft.aux_layer_ids, device, world, shard=False)
    torch.manual_seed(cfg.seed)
    attn_impl = runtime.attn_impl
    spec = LoaderSpec(micro_batch_len(cfg, runtime), draft.hidden_size, len(draft.aux_layer_ids),
                      cfg.data.train_ratio, cfg.seed, grad_accum=optim.grad_accum, device=device,
                      hidden_states_dtype=getattr(torch, cfg.data.hidden_states_dtype.value))
    loader, val_loader = build_loaders(rows_dir, spec, verifier)
    model, _ = build_draft(InitContext(draft, cfg.init, verifier_dir, rows_dir, attn_impl, []))
    model = model.to(device).train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=optim.lr, betas=(optim.betas[0], optim.betas[1]),
                                  weight_decay=optim.weight_decay)
    scheduler = make_scheduler(optimizer, optim.scheduler.value, 0, 10**9)
    autocast = torch.autocast("cuda", dtype=runtime.dtype()) if cuda else nullcontext()
    call_kwargs = {"ttt_steps": draft.ttt_steps, "ttt_step_loss_decay": draft.ttt_step_loss_decay,
                   "loss_config": resolve_loss_config(draft.loss, runtime.loss_impl)}
    parts = StepParts(model, optimizer, scheduler, trainable, optim.grad_accum, optim.grad_clip, device, autocast,
                      call_kwargs, world)
    window: dict = {}
    micro = args.steps * optim.grad_accum
    if micro > len(loader):
        raise SystemExit(f"--steps {args.steps} x grad_accum {optim.grad_accum} micro-batches, but epoch 0 has "
                         f"{len(loader)}: ask for fewer steps")

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def first_micro_batches(n: int):
        loader.batch_sampler.set_epoch(0)
        for _, batch in zip(range(n), loader):
            yield batch

    def steps(micro_batches, n: int) -> None:
        for _ in range(n):
            train_step(parts, micro_batches, window)

    # The same micro-batches for the train-step side, copied: the loader refills one buffer for every micro-batch.
    stored = [{k: v.clone() for k, v in b.items()} for b in first_micro_batches(micro)]
    sync()
    tokens = sum(int((b["document_ids"] >= 0).sum()) for b in stored)

    def online(n: int) -> None:
        steps(first_micro_batches(n * optim.grad_accum), n)

    def verifier_forward(n: int) -> None:
        for _ in first_micro_batches(n * optim.grad_accum):
            pass

    def stored_steps(n: int) -> None:
        steps(iter(stored[: n * optim.grad_accum]), n)

    sides = {"online": online, "verifier_forward": verifier_forward, "train_step": stored_steps}
    for run in sides.values():
        run(args.warmup)
    sync()
    seconds: dict[str, list[float]] = {name: [] for name in sides}
    cpu_seconds: dict[str, list[float]] = {name: [] for name in sides}
    for rep in range(args.reps):
        order = list(sides)[rep % 3:] + list(sides)[:rep % 3]
        for name in order:
            start, cpu_start = time.perf_counter(), time.process_time()
            sides[name](args.steps)
            sync()
            seconds[name].append(time.perf_counter() - start)
            cpu_seconds[name].append(time.process_time() - cpu_start)

    def per_rep_ratios(s: dict[str, list[float]]) -> list[float]:
        # online tokens/s over tokens / (t_vf + t_ts): the tokens cancel.
        return [(vf + ts) / on for on, vf, ts in zip(s["online"], s["verifier_forward"], s["train_step"])]

    ratios, cpu_ratios = per_rep_ratios(seconds), per_rep_ratios(cpu_seconds)
    shares = [vf / (vf + ts) for vf, ts in zip(seconds["verifier_forward"], seconds["train_step"])]
    med = {name: statistics.median(s) for name, s in seconds.items()}
    per_micro = {name: med[name] / micro for name in sides}
    ratio, share = statistics.median(ratios), statistics.median(shares)
    # Each side's fastest rep: the one least disturbed by other processes, on a machine that is not idle.
    fastest = (min(seconds["verifier_forward"]) + min(seconds["train_step"])) / min(seconds["online"])
    result = {"device": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
              "torch_threads": torch.get_num_threads(), "steps": args.steps, "micro_batches": micro, "reps": args.reps,
              "warmup": args.warmup, "tokens": tokens, "total_seq_len": loader.total_seq_len,
              "overrides": [*(SMALL if args.small else []), *args.overrides],
              "online_tokens_per_s": tokens / med["online"],
              "separate_tokens_per_s": tokens / (med["verifier_forward"] + med["train_step"]),
              "t_verifier_forward_s": per_micro["verifier_forward"], "t_train_step_s": per_micro["train_step"],
              "t_online_s": per_micro["online"], "ratio": ratio, "verifier_share": share,
              "ratio_cpu_time": statistics.median(cpu_ratios), "ratio_fastest_reps": fastest,
              "ratios": ratios, "ratios_cpu_time": cpu_ratios}
    print(f"{micro} micro-batches of {loader.total_seq_len} tokens ({tokens} real), {args.reps} reps after "
          f"{args.warmup} warm-up steps; device {result['device']}, torch threads {torch.get_num_threads()}")
    for name, label in (("online", "online step"), ("verifier_forward", "verifier forward"),
                        ("train_step", "train step")):
        print(f"{label:18s}{per_micro[name] * 1e3:9.2f} ms per micro-batch   "
              f"(reps: {', '.join(f'{s / micro * 1e3:.2f}' for s in seconds[name])})")
    print(f"online {result['online_tokens_per_s']:.0f} tokens/s; verifier forward + train step timed apart "
          f"{result['separate_tokens_per_s']:.0f} tokens/s; verifier share of a step {share:.3f}")
    print(f"ratio online / (tokens / (t_verifier_forward + t_train_step)): {ratio:.3f} (median of per-rep ratios; "
          f"reps: {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"same ratio from each side's fastest rep: {fastest:.3f}")
    if not cuda:  # the process's CPU time: what other processes on a shared machine take from it does not count
        print(f"same ratio in process CPU time: {result['ratio_cpu_time']:.3f} "
              f"(reps: {', '.join(f'{r:.3f}' for r in cpu_ratios)})")
    # Val passes: the first computes the val split's hidden states and keeps them, later ones read them back
    # (eagle3.data.online.HiddenStore). Between them, a pass of a loader that computes every time, for a reference
    # taken under the same load.
    from eagle3.train.validation import run_validation

    cpu_val: list[float] = []

    def val_pass(val) -> float:
        sync()
        start, cpu_start = time.perf_counter(), time.process_time()
        run_validation(model, val, device, autocast, call_kwargs)
        sync()
        cpu_val.append(time.process_time() - cpu_start)
        return time.perf_counter() - start

    uncached = copy.copy(val_loader)
    uncached.store, uncached.buffer = None, None
    first = val_pass(val_loader)
    computed = [val_pass(uncached)]
    second = val_pass(val_loader)
    computed.append(val_pass(uncached))
    cpu_first, cpu_computed, cpu_second = cpu_val[0], [cpu_val[1], cpu_val[3]], cpu_val[2]
    result.update({"val_first_s": first, "val_second_s": second, "val_uncached_s": computed,
                   "val_second_over_first": second / first,
                   "val_second_over_uncached": second / statistics.mean(computed),
                   "val_cpu_s": cpu_val, "val_second_over_first_cpu_time": cpu_second / cpu_first,
                   "val_second_over_uncached_cpu_time": cpu_second / statistics.mean(cpu_computed)})
    model.train()
    print(f"val passes over {len(val_loader)} micro-batches: first {first:.2f} s, second {second:.2f} s "
          f"(uncached passes between: {', '.join(f'{c:.2f}' for c in computed)} s); second / first "
          f"{second / first:.3f}, second / uncached {result['val_second_over_uncached']:.3f}")
    if not cuda:  # as above: what other processes take from this one does not count
        print(f"same in process CPU time: first {cpu_first:.2f} s, second {cpu_second:.2f} s (uncached: "
              f"{', '.join(f'{c:.2f}' for c in cpu_computed)} s); second / first "
              f"{result['val_second_over_first_cpu_time']:.3f}, second / uncached "
              f"{result['val_second_over_uncached_cpu_time']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
