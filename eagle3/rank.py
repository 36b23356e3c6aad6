"""One rank of a run: device, process group, seed, data, draft model, then the training loop.

`run_rank` runs in the launcher's process for a single-process run; `worker` is what the elastic
launcher starts in each rank's process.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from eagle3.checkpoint import check_disk, load_draft, load_trainer_state
from eagle3.config import RunConfig, plain_config
from eagle3.console import format_result_table, log_file, quiet_libraries, setup_rank_logging
from eagle3.distributed import World, close_world, init_world, wrap_model
from eagle3.errors import UserError
from eagle3.init import InitContext, build_draft
from eagle3.progress import RunSummary, job_clock
from eagle3.rank_errors import write_rank_error
from eagle3.recompute import recompute_decoder_layers
from eagle3.rundir import InitReport, RunDir, checkpoint_dir
from eagle3.runtime import Runtime, runtime_of
from eagle3.track import Tracker
from eagle3.train import train

log = logging.getLogger(__name__)

# This process's environment when this module was imported: in a rank forked from the launcher's forkserver
# (eagle3/elastic.py), the server's, from when it started, before the elastic agent set the rank's variables.
_ENV_AT_IMPORT = dict(os.environ)


def worker(cfg: RunConfig, verifier_dir: Path, data_dir: Path, rows: list[int] | None,
           launcher_env: dict[str, str]) -> RunSummary | None:
    """One rank's process under the elastic launcher, with the environment `launcher_env` (the launcher's when it
    launched). An error is written to the rank's log file (rank_<N>.log; rank 0: launch.log) and recorded in the
    run dir for the launcher to report (eagle3/rank_errors.py); the process then exits 1, so the elastic agent has
    nothing to print but an exit code."""
    take_environment(launcher_env)
    rank = int(os.environ["RANK"])
    run_dir = Path(cfg.run.dir)
    setup_rank_logging(run_dir, rank)
    try:
        return run_rank(cfg, verifier_dir, data_dir, rows)
    except Exception as e:
        record = write_rank_error(run_dir, rank, e)
        # Into the rank's log file only (rank 0's too: the console gets the launcher's one message, which names
        # the first failing rank; later ones fail because of it, e.g. "Connection closed by peer").
        text = f"{record.type}: {record.message}\n" if record.user else record.traceback
        try:
            with log_file(run_dir, "launch.log" if rank == 0 else f"rank_{rank}.log") as f:
                f.write(f"[rank {rank}] failed: {text}")
        except UserError:
            pass  # a link in its place: the record above and the launcher's message hold the error
        raise SystemExit(1) from None


def take_environment(launcher_env: dict[str, str]) -> None:
    """os.environ becomes `launcher_env` with the rank's own variables on top: those the elastic agent set
    (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_PORT, TORCHELASTIC_*, ...), which are what differs from the environment
    this process had when this module was imported."""
    per_rank = {k: v for k, v in os.environ.items() if _ENV_AT_IMPORT.get(k) != v}
    os.environ.clear()
    os.environ.update(launcher_env)
    os.environ.update(per_rank)


FLEX_BLOCK = 128  # flex attention's default block size, which speculators' block masks use


def packed_len(total_seq_len: int, attn_impl: str, ttt_steps: int) -> int:
    """Tokens per packed micro-batch: data.total_seq_len, rounded up to whole flex-attention blocks when flex
    attention runs more than one TTT step. speculators extends the block mask by whole blocks at each TTT step,
    so any other length fails at the second step ("block_mask was created for a larger length ...")."""
    if attn_impl != "simple_flex_attention" or ttt_steps < 2 or total_seq_len % FLEX_BLOCK == 0:
        return total_seq_len
    padded = -(-total_seq_len // FLEX_BLOCK) * FLEX_BLOCK
    log.warning("data.total_seq_len=%d packs %d tokens per micro-batch: flex attention with %d TTT steps needs a "
                "multiple of %d", total_seq_len, padded, ttt_steps, FLEX_BLOCK)
    return padded


def micro_batch_len(cfg: RunConfig, runtime: Runtime) -> int:
    """Tokens per packed micro-batch of this run (packed_len of its attention implementation)."""
    return packed_len(cfg.data.total_seq_len, runtime.attn_impl, cfg.model.draft.ttt_steps)


def run_rank(cfg: RunConfig, verifier_dir: Path, data_dir: Path, rows: list[int] | None = None) -> RunSummary | None:
    """Trains one draft as `cfg` (the resolved run config) says, on `rows` of the data (None: all of them);
    rank 0 returns the run summary."""
    quiet_libraries()
    run_dir = Path(cfg.run.dir)
    runtime = runtime_of(cfg)
    device = runtime.device(int(os.environ.get("LOCAL_RANK", 0)))
    world = init_world(cfg.distributed.strategy.value, runtime.backend, device.type)
    try:
        return _train_on(world, runtime, device, cfg, run_dir, verifier_dir, data_dir, rows)
    finally:
        close_world(world)


def _train_on(world: World, runtime: Runtime, device: torch.device, cfg: RunConfig, run_dir: Path, verifier_dir: Path,
              data_dir: Path, rows: list[int] | None) -> RunSummary | None:
    draft = cfg.model.draft
    verifier = None
    in_rank = cfg.data.verifier_in_rank()
    if in_rank:  # before seeding: loading must not move the draft's initialization
        from eagle3.data.online import load_online_verifier

        verifier = load_online_verifier(verifier_dir, draft.aux_layer_ids, device, world, in_rank == "sharded")
    torch.manual_seed(cfg.seed)
    attn_impl = runtime.attn_impl
    with job_clock().phase("data build"):
        train_loader, val_loader = cfg.data.loaders(
            data_dir, verifier, run_dir,
            total_seq_len=micro_batch_len(cfg, runtime),
            hidden_size=draft.hidden_size,
            num_aux_layers=len(draft.aux_layer_ids),
            seed=cfg.seed,
            world_size=world.size,
            rank=world.rank,
            grad_accum=cfg.optim.grad_accum,
            rows=rows,
            device=device,
        )
    last = checkpoint_dir(run_dir, "last")
    resume_state = None
    if cfg.resume:
        model = load_draft(last, attn_impl, verifier_dir=verifier_dir)
        resume_state = load_trainer_state(last)
    else:
        ctx = InitContext(draft=draft, init=cfg.init, verifier_dir=verifier_dir, data_dir=data_dir,
                          attn_impl=attn_impl, overrides=cfg.run.overrides)
        model, init_report = build_draft(ctx)
        if world.is_main:
            RunDir(run_dir).write_init_report(InitReport.from_dict(init_report))
    if draft.gradient_checkpointing:  # a run dir from before the knob reads its schema default (false)
        recompute_decoder_layers(model)
    if world.is_main:
        check_disk(run_dir, model)
    on_policy = None
    if cfg.train.on_policy.enabled:
        from eagle3.rollouts import build_on_policy

        on_policy = build_on_policy(cfg.train.on_policy, model.to(device), verifier.model if verifier else None,
                                    verifier_dir, data_dir, cfg.data.train_ratio, rows, draft.ttt_steps, device,
                                    world, cfg.seed)
    model = wrap_model(model.to(device), world, device)

    at_val = None
    if cfg.eval.accept.enabled:
        from eagle3.eval.at_val import AcceptanceAtVal

        held = verifier.model if verifier is not None else on_policy.verifier if on_policy is not None else None
        at_val = AcceptanceAtVal(cfg.eval.accept, cfg.data.train_ratio, verifier_dir, data_dir, device, world,
                                 seed=cfg.seed, verifier=held)  # the run's copy where it holds one
    resume_step = resume_state["progress"]["step"] if resume_state else None
    with Tracker(run_dir, cfg.logger, cfg.run, plain_config(cfg), enabled=world.is_main,
                 resume_step=resume_step) as tracker:
        progress = train(model, train_loader, val_loader, draft, cfg.optim, cfg.logger.log_every, device, world,
                         tracker, run_dir, resume_state, at_val, cfg.data.on_bad_sample.value, plain_config(cfg),
                         on_policy)
        summary = RunSummary.of(progress, verifier_dir, data_dir, str(device), world.size)
        tracker.finish(summary)
    if not world.is_main:
        return None
    log.info("results (val)\n%s", format_result_table(summary, draft.ttt_steps))
    log.info("run dir: %s", run_dir)
    return summary
