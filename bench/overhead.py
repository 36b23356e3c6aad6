"""What the framework costs per training step: this project's step against a bare loop, in one process.

    python bench/overhead.py [--steps 20] [--reps 5] [--warmup 3]

Both loops train the same draft (two copies of one initialization) on the same pre-built batches with the
same optimizer settings. The bare loop is zero_grad, forward, backward, clip, step. The project's step is what the
trainer runs (eagle3.train.loop.train_step + StepLog): metric accumulation and reduction, the scheduler, the
progress bar, and a train row in metrics.jsonl every `logger.log_every` steps; evaluation and checkpoints
are excluded. The two alternate rep by rep; the ratio printed is the median over reps of project / bare
within a rep, which cancels slow drift in the machine's speed; the medians of their tokens/s come with it.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

from common import tiny_run_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per timed rep")
    parser.add_argument("--reps", type=int, default=9, help="timed reps of each loop")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps of each loop first")
    args = parser.parse_args()

    import torch
    from speculators.losses import resolve_loss_config

    from eagle3.console import quiet_libraries
    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.data.reader import to_device
    from eagle3.device.distributed import World
    from eagle3.init import InitContext, build_draft
    from eagle3.run.inputs import materialize_inputs
    from eagle3.rundir.progress import Progress
    from eagle3.train.loop import StepParts, count_step, log_train_row, make_scheduler, train_step
    from eagle3.train.track import Tracker
    from eagle3.train.train_rows import StepLog

    quiet_libraries()
    cfg = tiny_run_config()
    verifier_dir, data_dir = materialize_inputs(cfg)
    draft, optim = cfg.model.draft, cfg.optim
    loader, _ = build_loaders(data_dir, LoaderSpec(cfg.data.total_seq_len, draft.hidden_size, len(draft.aux_layer_ids),
                                                   cfg.data.train_ratio, cfg.seed))
    # Copies: the reader reuses its buffers, and these batches are kept for the whole benchmark.
    batches = [{k: v.clone() for k, v in to_device(b, torch.device("cpu")).items()}
               for _, b in zip(range(args.steps), loader)]
    tokens = sum(int((b["document_ids"] >= 0).sum()) for b in batches)
    torch.manual_seed(0)
    model, _ = build_draft(InitContext(draft, cfg.init, verifier_dir, data_dir, "sdpa", []))
    kwargs = {"ttt_steps": draft.ttt_steps, "ttt_step_loss_decay": draft.ttt_step_loss_decay,
              "loss_config": resolve_loss_config(draft.loss, "eager")}

    def optimizer_for(m):
        params = [p for p in m.parameters() if p.requires_grad]
        return params, torch.optim.AdamW(params, lr=optim.lr, betas=tuple(optim.betas),
                                         weight_decay=optim.weight_decay)

    bare_model, project_model = copy.deepcopy(model), copy.deepcopy(model)
    bare_params, bare_opt = optimizer_for(bare_model)
    project_params, project_opt = optimizer_for(project_model)
    scheduler = make_scheduler(project_opt, optim.scheduler.value, 0, 10**9)
    run_dir = Path(tempfile.mkdtemp(prefix="eagle3-bench-"))
    tracker = Tracker(run_dir, cfg.logger).__enter__()
    progress = Progress()
    log = StepLog(tracker, World(), scheduler, 10**9, progress)
    parts = StepParts(project_model, project_opt, scheduler, project_params, 1, optim.grad_clip, torch.device("cpu"),
                      nullcontext(), kwargs)

    def bare(batch):
        bare_opt.zero_grad(set_to_none=True)
        _, loss, _ = bare_model(**batch, **kwargs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(bare_params, optim.grad_clip)
        bare_opt.step()

    def project(batch):
        grad_norm = train_step(parts, iter([batch]), log.window)
        count_step(progress, grad_norm, 0, 1, World())  # what the loop does after each step
        log.count(grad_norm)
        if progress.step % cfg.logger.log_every == 0:
            log_train_row(log, progress, World())

    def timed(step_fn) -> float:
        start = time.perf_counter()
        for batch in batches:
            step_fn(batch)
        return tokens / (time.perf_counter() - start)

    for step_fn in (bare, project):
        for batch in batches[: args.warmup]:
            step_fn(batch)
    rates = {"bare": [], "project": []}
    for rep in range(args.reps):
        order = (("bare", bare), ("project", project)) if rep % 2 == 0 else (("project", project), ("bare", bare))
        for name, step_fn in order:
            rates[name].append(timed(step_fn))
    log.close()
    tracker.__exit__(None, None, None)
    bare_rate, project_rate = statistics.median(rates["bare"]), statistics.median(rates["project"])
    # Each rep's two timings are adjacent in time: their ratio cancels the machine's slow drifts.
    paired = statistics.median(p / b for p, b in zip(rates["project"], rates["bare"]))
    print(f"batches: {len(batches)} x {cfg.data.total_seq_len} tokens ({tokens} real), "
          f"{args.reps} reps, torch threads {torch.get_num_threads()}")
    print(f"bare loop      {bare_rate:10.0f} tokens/s   (reps: {', '.join(f'{r:.0f}' for r in rates['bare'])})")
    print(f"project step   {project_rate:10.0f} tokens/s   (reps: {', '.join(f'{r:.0f}' for r in rates['project'])})")
    print(f"ratio project / bare: {paired:.3f} "
          f"(median of per-rep ratios; ratio of medians {project_rate / bare_rate:.3f})")


if __name__ == "__main__":
    main()
