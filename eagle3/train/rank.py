"""One rank of a run: device, process group, seed, data, draft model, the run's optional features as the loop's
hooks, then the training loop, handed all of it as one `Training`.

`run_rank` runs in the launcher's process for a single-process run; `worker` is what the elastic
launcher starts in each rank's process.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eagle3.arch.activation_checkpointing import recompute_decoder_layers
from eagle3.arch.packing import packed_len
from eagle3.config import RunConfig, plain_config
from eagle3.console import log_file, quiet_libraries, setup_rank_logging
from eagle3.data.sources import source_of
from eagle3.device.choice import Runtime, runtime_of
from eagle3.device.distributed import World, close_world, init_world, wrap_model
from eagle3.errors import UserError
from eagle3.init import InitContext, build_draft
from eagle3.init.checkpoint import check_disk, load_draft, load_trainer_state
from eagle3.rundir.files import InitReport, RunDir, checkpoint_dir
from eagle3.rundir.progress import RunSummary, format_result_table, job_clock
from eagle3.rundir.rank_errors import write_rank_error
from eagle3.train.loop import ExtraLoss, Hook, Run, Training, ValEntries, train
from eagle3.train.stop import stop_before_training
from eagle3.train.track import Tracker

if TYPE_CHECKING:
    from eagle3.data.online import OnlineVerifier
    from eagle3.train.on_policy import OnPolicy

log = logging.getLogger(__name__)

# This process's environment when this module was imported: in a rank forked from the launcher's forkserver
# (eagle3/run/elastic.py), the server's, from when it started, before the elastic agent set the rank's variables.
_ENV_AT_IMPORT = dict(os.environ)


def worker(cfg: RunConfig, verifier_dir: Path, data_dir: Path, rows: list[int] | None,
           launcher_env: dict[str, str]) -> RunSummary | None:
    """One rank's process under the elastic launcher, with the environment `launcher_env` (the launcher's when it
    launched). An error is written to the rank's log file (rank_<N>.log; rank 0: launch.log) and recorded in the
    run dir for the launcher to report (eagle3/rundir/rank_errors.py); the process then exits 1, so the elastic agent
    has nothing to print but an exit code."""
    take_environment(launcher_env)
    rank = int(os.environ["RANK"])
    run_dir = Path(cfg.run.dir)
    setup_rank_logging(run_dir, rank)
    try:
        with stop_before_training("starting the rank"):  # the loop's own handler from its first step to its last
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


def micro_batch_len(cfg: RunConfig, runtime: Runtime) -> int:
    """Tokens per packed micro-batch of this run (packed_len of its attention implementation)."""
    return packed_len(cfg.data.total_seq_len, runtime.attn_impl, cfg.model.draft.ttt_steps)


def run_rank(cfg: RunConfig, verifier_dir: Path, data_dir: Path, rows: list[int] | None = None) -> RunSummary | None:
    """Trains one draft as `cfg` (the resolved run config) says, on `rows` of the data (None: all of them);
    rank 0 returns the run summary."""
    quiet_libraries()
    runtime = runtime_of(cfg)
    device = runtime.device(int(os.environ.get("LOCAL_RANK", 0)))
    world = init_world(cfg.distributed.strategy.value, runtime.backend, device.type)
    try:
        return _train_on(RankSetup(cfg, runtime, device, world, verifier_dir, data_dir, rows))
    finally:
        close_world(world)


@dataclass(frozen=True)
class RankSetup:
    """What one rank trains with, resolved once: the typed run config, its runtime, this rank's device and process
    group, and the inputs the launcher made ready (the verifier and data dirs, the rows to train on)."""

    cfg: RunConfig
    runtime: Runtime
    device: torch.device
    world: World
    verifier_dir: Path
    data_dir: Path
    rows: list[int] | None

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run.dir)


def _train_on(rank: RankSetup) -> RunSummary | None:
    """The rank's parts in the order that keeps its random draws: the online verifier before the seed, then the
    loaders, the draft and its hooks; then the loop."""
    cfg, world, device, run_dir = rank.cfg, rank.world, rank.device, rank.run_dir
    verifier = online_verifier(rank)  # before seeding: loading must not move the draft's initialization
    torch.manual_seed(cfg.seed)
    with job_clock().phase("data build"):
        loaders = source_of(cfg.data).loaders(
            rank.data_dir, verifier, run_dir,
            total_seq_len=micro_batch_len(cfg, rank.runtime),
            hidden_size=cfg.model.draft.hidden_size,
            num_aux_layers=len(cfg.model.draft.aux_layer_ids),
            seed=cfg.seed,
            world_size=world.size,
            rank=world.rank,
            grad_accum=cfg.optim.grad_accum,
            rows=rank.rows,
            device=device,
        )
    model, resume_state = draft_to_train(rank)
    hooks = run_hooks(rank, model.to(device), verifier)
    model = wrap_model(model.to(device), world, device)
    resume_step = resume_state["progress"]["step"] if resume_state else None
    with Tracker(run_dir, cfg.logger, cfg.run, plain_config(cfg), enabled=world.is_main,
                 resume_step=resume_step) as tracker:
        progress = train(Training(model, loaders, cfg, tracker, device, world, resume_state, hooks))
        summary = RunSummary.of(progress, rank.verifier_dir, rank.data_dir, str(device), world.size)
        tracker.finish(summary)
    if not world.is_main:
        return None
    log.info("results (val)\n%s", format_result_table(summary, cfg.model.draft.ttt_steps))
    log.info("run dir: %s", run_dir)
    return summary


def online_verifier(rank: RankSetup) -> OnlineVerifier | None:
    """The verifier the rank holds to compute hidden states in the loop (data=online), or None."""
    in_rank = rank.cfg.data.verifier_in_rank()
    if not in_rank:
        return None
    from eagle3.data.online import load_online_verifier

    return load_online_verifier(rank.verifier_dir, rank.cfg.model.draft.aux_layer_ids, rank.device, rank.world,
                                in_rank == "sharded")


def draft_to_train(rank: RankSetup) -> tuple[torch.nn.Module, dict[str, Any] | None]:
    """The (unwrapped) draft the loop trains and, for a resumed run, the trainer state of its checkpoints/last: a
    new run's draft as its initializer builds it (its report into the run dir), a resumed run's from `last`."""
    cfg, run_dir = rank.cfg, rank.run_dir
    draft, attn_impl = cfg.model.draft, rank.runtime.attn_impl
    resume_state = None
    if cfg.resume:
        last = checkpoint_dir(run_dir, "last")
        model = load_draft(last, attn_impl, verifier_dir=rank.verifier_dir)
        resume_state = load_trainer_state(last)
    else:
        ctx = InitContext(draft=draft, init=cfg.init, verifier_dir=rank.verifier_dir, data_dir=rank.data_dir,
                          attn_impl=attn_impl, overrides=cfg.run.overrides)
        model, init_report = build_draft(ctx)
        if rank.world.is_main:
            RunDir(run_dir).write_init_report(InitReport.from_dict(init_report))
    if draft.gradient_checkpointing:  # a run dir from before the knob reads its schema default (false)
        recompute_decoder_layers(model)
    if rank.world.is_main:
        check_disk(run_dir, model)
    return model, resume_state


def run_hooks(rank: RankSetup, model: torch.nn.Module, verifier: OnlineVerifier | None) -> list[Hook]:
    """The run's optional features as the loop's hooks, for the (unwrapped) draft `model`: on-policy rollouts
    (train.on_policy) and measured acceptance at each val pass (eval.accept). They share the verifier the rank
    already holds (data=online's, else the rollouts') instead of loading a second copy."""
    cfg = rank.cfg
    hooks: list[Hook] = []
    held = verifier.model if verifier is not None else None
    if cfg.train.on_policy.enabled:
        from eagle3.train.on_policy import build_on_policy

        on_policy = build_on_policy(cfg.train.on_policy, model, held, rank.verifier_dir, rank.data_dir,
                                    cfg.data.train_ratio, rank.rows, cfg.model.draft.ttt_steps, rank.device,
                                    rank.world, cfg.seed)
        hooks.append(OnPolicyRollouts(on_policy))
        held = on_policy.verifier
    if cfg.eval.accept.enabled:
        from eagle3.train.val_acceptance import AcceptanceAtVal

        hooks.append(ValEntries(AcceptanceAtVal(cfg.eval.accept, cfg.data.train_ratio, rank.verifier_dir,
                                                rank.data_dir, rank.device, rank.world, seed=cfg.seed,
                                                verifier=held)))  # the run's copy where it holds one
    return hooks


class OnPolicyRollouts(Hook):
    """train.on_policy: the steps it says also train on rollouts of the draft (eagle3/train/on_policy.py), mixed in at
    train.on_policy.mix."""

    def __init__(self, on_policy: OnPolicy):
        self.on_policy = on_policy

    def step_loss(self, run: Run, step: int) -> ExtraLoss | None:
        on_policy, parts = self.on_policy, run.parts
        if not on_policy.due(step):
            return None
        return on_policy.mix, lambda: on_policy.loss(run.model, step, parts.call_kwargs["loss_config"],
                                                     parts.call_kwargs["ttt_step_loss_decay"], parts.autocast)
