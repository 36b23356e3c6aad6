"""The training loop: AdamW, warmup + decay, clipping, gradient accumulation, a val pass before any update
and after each epoch, checkpoints `last` (resumable) and `best` (highest val tau_sim). Runs on CPU or GPU,
in one process or many; speculators' own Trainer is CUDA-only. The loop owns its counters (the run's Progress);
the val pass is eagle3/train/validation.py's, the train rows and the bar eagle3/train/train_rows.py's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from eagle3.config import RunConfig, TrainConfig, plain_config
from eagle3.console import resume_command
from eagle3.data.reader import to_device
from eagle3.device.choice import compute_dtype_on, loss_impl_on
from eagle3.device.distributed import (
    World,
    barrier,
    full_model_state,
    full_optimizer_state,
    grad_sync,
    load_optimizer_state,
    reduce_sums,
    unwrap,
)
from eagle3.errors import RunStopped
from eagle3.eval.metric_sums import accumulate
from eagle3.init.checkpoint import TRAINER_STATE, SaveFailed, save_checkpoint
from eagle3.rundir.files import CHECKPOINTS, trained_config
from eagle3.rundir.progress import Progress, Row, job_clock
from eagle3.train.cadence import Cadence, Stop
from eagle3.train.stop import StopRequest, stop_before_training
from eagle3.train.track import Tracker
from eagle3.train.train_rows import StepLog
from eagle3.train.validation import run_validation

if TYPE_CHECKING:
    from eagle3.data.loader import Loader

log = logging.getLogger(__name__)

__all__ = ["train", "Training", "Hook", "ValEntries", "StepParts", "train_step", "make_scheduler", "RunStopped"]

ExtraLoss = tuple[float, Callable[[], tuple[torch.Tensor, dict[str, torch.Tensor]]]]


class Hook:
    """An optional feature of a run, plugged into the loop at its points (every method's default does nothing), so
    that a feature adds a hook, not a parameter of `train`. Every rank calls every hook at the same points, so a
    hook may hold a collective. `progress` is the loop's own (eagle3.rundir.progress.Progress): read it, never
    change it.

    The points, in a run's order: on_val of the step-0 val pass (a new run), on_train_start, then per optimizer step
    step_loss (before it) and on_step_end (after it, counted), on_val of each later val pass, on_train_end."""

    def on_train_start(self, run: Run, progress: Progress) -> None:
        """The loop starts (or continues a resumed run) at `progress`."""

    def step_loss(self, run: Run, step: int) -> ExtraLoss | None:
        """A loss the optimizer step after `step` done ones also trains on: (mix, loss) weights its loss `mix` and
        the micro-batches' 1 - mix (on-policy rollouts); None: this step trains on the micro-batches alone."""
        return None

    def on_step_end(self, run: Run, progress: Progress) -> None:
        """An optimizer step was taken (or skipped) and counted into `progress`."""

    def on_val(self, run: Run, row: Row) -> Row:
        """Entries to add to the val row `row` (its metrics so far) before it is logged (measured acceptance)."""
        return {}

    def on_train_end(self, run: Run, progress: Progress) -> None:
        """The loop completed at `progress` (not called when it stops early or fails)."""


class ValEntries(Hook):
    """A hook that adds `measure(model)`'s entries to each val row (eval.accept's AcceptanceAtVal is one)."""

    def __init__(self, measure: Callable[[torch.nn.Module], Row]):
        self.measure = measure

    def on_val(self, run: Run, row: Row) -> Row:
        return self.measure(run.model)


@dataclass
class Training:
    """What the training loop is handed: the draft (already wrapped for `world`), its train and val loaders, the
    typed run config that runs (optim, model.draft's TTT settings, logger.log_every, data.on_bad_sample, run.dir;
    saved with `last` so that a resume can tell whether its config is still the one trained with), the tracker,
    the device and process group, a resumed run's trainer state, and the run's optional features as hooks."""

    model: torch.nn.Module
    loaders: tuple[Loader, Loader]
    cfg: RunConfig
    tracker: Tracker
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    world: World = field(default_factory=World)
    resume_state: dict[str, Any] | None = None
    hooks: list[Hook] = field(default_factory=list)


def train(training: Training) -> Progress:
    """Trains the draft as `training.cfg` says; returns the loop's final progress.

    At the top of each step the loop asks its Cadence what is due (eagle3/train/cadence.py) and does it."""
    run = Run(training)
    train_loader, cadence, world, hooks = training.loaders[0], run.cadence, run.world, training.hooks
    sampler = train_loader.batch_sampler
    clock = job_clock()
    clock.loop_starts()
    progress = run.begin(training.resume_state)
    steps = StepLog(training.tracker, world, run.parts.scheduler, cadence.total_steps, progress)
    stop, micro_batches, stepped, skipped_in_a_row = StopRequest(), None, False, 0
    try:
        run.model.train()
        for hook in hooks:
            hook.on_train_start(run, progress)
        while True:
            due = cadence.due(progress, stepped, skipped_in_a_row, stepped and stop.requested(world))
            if due.train_row:
                log_train_row(steps, progress, world)
            if due.stop is not None:
                run.save("last", progress)  # skipped steps changed no weight: `last` is the last good state
                if due.stop is Stop.signal:
                    stop.exit(run.run_dir, progress.step)
                raise RunStopped(too_many_skipped(skipped_in_a_row, progress.step))
            if due.next_epoch:
                progress.epoch, progress.step_in_epoch, micro_batches = progress.epoch + 1, 0, None
            if due.val_epoch is not None:
                run.validate(progress, due.val_epoch)
            if due.epoch_end:
                progress.train_wall_s = steps.wall()
            if due.save:
                run.save("last", progress)
            if due.done:
                break
            if micro_batches is None:
                sampler.set_epoch(progress.epoch, skip_steps=progress.step_in_epoch)
                micro_batches = iter(train_loader)
            with clock.phase("training steps"):
                grad_norm = run.step(micro_batches, steps.window, progress.step)
            skipped_in_a_row = count_step(progress, grad_norm, skipped_in_a_row, run.optim.max_skipped_steps, world)
            steps.count(grad_norm)
            stepped = True
            for hook in hooks:
                hook.on_step_end(run, progress)
        for hook in hooks:
            hook.on_train_end(run, progress)
    finally:  # also when the run stops with an error: the next job of a sweep gets its handlers back
        steps.close()
        stop.restore()
    return progress


@dataclass
class StepParts:
    """What one optimizer step acts on (train_step): the wrapped model, its optimizer and lr schedule over
    `trainable`, optim.grad_accum micro-batches per step, optim.grad_clip, where it computes (`autocast` on CUDA)
    and the model's call arguments (the draft's TTT settings and loss)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    trainable: list[torch.nn.Parameter]
    accum: int
    grad_clip: float
    device: torch.device
    autocast: AbstractContextManager[Any]
    call_kwargs: dict[str, Any]
    world: World = field(default_factory=World)

    @classmethod
    def of(cls, model: torch.nn.Module, cfg: TrainConfig, total_steps: int, device: torch.device,
           world: World) -> StepParts:
        """AdamW and the lr schedule cfg.optim says over `total_steps`, on the trainable parameters of `model`, with
        the loss and TTT settings of cfg.model.draft, on `device` in `world`."""
        from speculators.losses import resolve_loss_config

        optim, draft = cfg.optim, cfg.model.draft
        call_kwargs = {
            "ttt_steps": draft.ttt_steps,
            "ttt_step_loss_decay": draft.ttt_step_loss_decay,
            "loss_config": resolve_loss_config(draft.loss, loss_impl_on(device.type)),
        }
        dtype = getattr(torch, compute_dtype_on(device.type))
        autocast: AbstractContextManager[Any] = (torch.autocast("cuda", dtype=dtype)
                                                 if device.type == "cuda" else nullcontext())
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=optim.lr, betas=(optim.betas[0], optim.betas[1]),
                                      weight_decay=optim.weight_decay)
        scheduler = make_scheduler(optimizer, optim.scheduler.value, math.ceil(optim.warmup_ratio * total_steps),
                                   total_steps)
        return cls(model, optimizer, scheduler, trainable, optim.grad_accum, optim.grad_clip, device, autocast,
                   call_kwargs, world)


class Run:
    """What the loop acts on: the wrapped model, its optimizer and lr schedule, its val pass and checkpoints, and the
    run's hooks."""

    def __init__(self, training: Training):
        cfg = training.cfg
        self.cfg, self.optim, self.model, self.device = cfg, cfg.optim, training.model, training.device
        self.world, self.tracker, self.hooks = training.world, training.tracker, training.hooks
        self.val_loader, self.run_dir = training.loaders[1], Path(cfg.run.dir)
        self.on_bad_sample = cfg.data.on_bad_sample.value
        optim = cfg.optim
        self.cadence = Cadence.of(optim.epochs, optim.max_steps, training.loaders[0].batch_sampler.steps,
                                  cfg.logger.log_every, optim.eval_every, optim.checkpoint_every,
                                  optim.max_skipped_steps)
        self.parts = StepParts.of(self.model, cfg, self.cadence.total_steps, self.device, self.world)
        self.ckpt_dir = self.run_dir / CHECKPOINTS
        self.trained_config = trained_config(plain_config(cfg))  # saved with `last`: what it was trained with

    def begin(self, resume_state: dict[str, Any] | None) -> Progress:
        """A new run's progress after its step-0 val pass (the drafter as initialized, before any update; for a
        pretrained init its probe), or a resumed run's, with the optimizer, lr schedule and RNG it saved."""
        if resume_state is None:
            with stop_before_training("the val pass before the first step"):  # minutes on a real verifier
                step0 = self.evaluate(0, 0, 0.0)
                progress = Progress(step0=step0, best=step0, final=step0)
                self.save("best")
        else:
            progress = Progress.from_dict(resume_state["progress"], self.ckpt_dir / "last")
            load_optimizer_state(self.model, self.parts.optimizer, resume_state["optimizer"], self.world)
            self.parts.scheduler.load_state_dict(resume_state["scheduler"])
            torch.set_rng_state(resume_state["rng"])
            log.info("resuming at step %d (epoch %d, step %d of it)", progress.step, progress.epoch,
                     progress.step_in_epoch)
        log.info("training %s parameters for %d steps (%d per epoch, %d micro-batches each on %d ranks), lr %.2g",
                 f"{sum(p.numel() for p in self.parts.trainable):,}", self.cadence.total_steps,
                 self.cadence.steps_per_epoch, self.optim.grad_accum, self.world.size, self.optim.lr)
        return progress

    def step(self, micro_batches: Iterator[Any], window: dict[str, Any], step: int = 0) -> torch.Tensor | None:
        """The optimizer step after `step` done ones."""
        extra = [loss for hook in self.hooks if (loss := hook.step_loss(self, step)) is not None]
        return train_step(self.parts, micro_batches, window, extra)

    def evaluate(self, step: int, epoch: int, tokens: float) -> Row:
        """The val pass after `step` steps, which trained `tokens` tokens (the row's x for learning curves)."""
        with job_clock().phase("val passes"):
            return self._evaluate(step, epoch, tokens)

    def _evaluate(self, step: int, epoch: int, tokens: float) -> Row:
        parts = self.parts
        metrics = run_validation(self.model, self.val_loader, self.device, parts.autocast, parts.call_kwargs,
                                 self.world, on_bad_sample=self.on_bad_sample, where=f"the val pass at step {step}")
        # tokens: trained so far (all ranks), what eagle3.sweep.forecast fits acceptance against
        row: Row = {"step": step, "split": "val", "epoch": epoch, "tokens": tokens, **metrics}
        for hook in self.hooks:
            row.update(hook.on_val(self, row))
        self.tracker.log(row)
        return row

    def validate(self, progress: Progress, epoch: int) -> None:
        """The val pass at `progress`'s step: its row becomes the final one, and `best` if it is the best."""
        progress.final = self.evaluate(progress.step, epoch, progress.tokens)
        self.model.train()
        if progress.final["tau_sim"] > progress.best["tau_sim"]:
            progress.best = progress.final
            self.save("best")

    def save(self, which: str, progress: Progress | None = None) -> None:
        """Every rank joins (gathering shards is a collective); rank 0 writes."""
        with job_clock().phase("saves"):
            self._save(which, progress)

    def _save(self, which: str, progress: Progress | None = None) -> None:
        model, world = self.model, self.world
        state = full_model_state(model, world)
        trainer_state = None
        if progress is not None:
            trainer_state = {"progress": progress.as_dict(),
                             "optimizer": full_optimizer_state(model, self.parts.optimizer, world),
                             "scheduler": self.parts.scheduler.state_dict(), "rng": torch.get_rng_state(),
                             "config": self.trained_config}
        if world.is_main:
            try:
                save_checkpoint(unwrap(model), state, self.ckpt_dir / which, trainer_state)
            except SaveFailed as e:
                last = (self.ckpt_dir / "last" / TRAINER_STATE).is_file()
                raise SaveFailed(f"{e}. Free space, then continue with: {resume_command(self.run_dir)}" if last else
                                 f"{e}. Nothing to resume yet: free space and start the run again") from None
        barrier(world)


def count_step(progress: Progress, grad_norm: torch.Tensor | None, skipped_in_a_row: int, max_skipped_steps: int,
               world: World) -> int:
    """Counts the step just taken into `progress`; returns how many steps in a row have now been skipped."""
    progress.step += 1
    progress.step_in_epoch += 1
    if grad_norm is not None:
        return 0
    progress.skipped_steps += 1
    skipped_in_a_row += 1
    if world.is_main:  # the train rows count them too, but only every log_every
        log.warning("step %d skipped: non-finite loss or gradient, weights unchanged (%d skipped so far, %d in a "
                    "row; optim.max_skipped_steps=%d in a row stops the run)", progress.step, progress.skipped_steps,
                    skipped_in_a_row, max_skipped_steps)
    return skipped_in_a_row


def too_many_skipped(skipped_in_a_row: int, step: int) -> str:
    return (f"{skipped_in_a_row} optimizer steps in a row had a non-finite loss or gradient "
            f"(steps {step - skipped_in_a_row + 1}..{step}), so the run stopped; checkpoints/last holds the weights "
            f"from before them. Lower optim.lr or check the data; optim.max_skipped_steps sets how many are tolerated")


def log_train_row(steps: StepLog, progress: Progress, world: World) -> None:
    """The train row of the steps since the last one; the tokens they trained and the wall time go into
    `progress`. None when every step of the window was skipped."""
    sums = reduce_sums(steps.take_window(), world)
    if not sums:
        return
    progress.tokens += sums.pop("tokens")
    progress.train_wall_s = steps.wall()
    steps.log(progress, sums)


def train_step(parts: StepParts, micro_batches: Iterator[Any], window: dict[str, Any],
               extra: Sequence[ExtraLoss] = ()) -> torch.Tensor | None:
    """One optimizer step over `parts.accum` micro-batches; adds their counted metrics to `window`; returns the
    gradient norm before clipping, or None when the loss or a gradient was not finite and the step was skipped
    (nothing applied, nothing counted). `extra` (mix, loss) each: a step that also trains on another loss (a hook's
    step_loss: rollouts of the draft, eagle3/train/on_policy.py) weighted `mix`, and on the micro-batches at 1 - the
    mixes; its gradients accumulate locally and are reduced across ranks with the last micro-batch's."""
    model, accum, world = parts.model, parts.accum, parts.world
    parts.optimizer.zero_grad(set_to_none=True)
    step_metrics: dict[str, Any] = {}
    share = 1.0
    for mix, extra_loss in extra:
        with grad_sync(model, world, sync=False):
            loss, metrics = extra_loss()
            (loss * mix).backward()
        accumulate(step_metrics, metrics)
        share -= mix
    for i in range(accum):
        batch = to_device(next(micro_batches), parts.device)
        with grad_sync(model, world, sync=i == accum - 1), parts.autocast:
            _, loss, metrics = model(**batch, **parts.call_kwargs)
            (loss / accum if not extra else loss * share / accum).backward()
        accumulate(step_metrics, {**metrics, "tokens": (batch["document_ids"] >= 0).sum()})
    grad_norm = torch.nn.utils.clip_grad_norm_(parts.trainable, parts.grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
        grad_norm = grad_norm.full_tensor()
    # The one read of a device value per step: a NaN loss gives a NaN norm, and AdamW would spread it to every
    # weight. The norm is already reduced across ranks, so all ranks decide alike.
    if not torch.isfinite(grad_norm):
        parts.optimizer.zero_grad(set_to_none=True)
        return None
    parts.optimizer.step()
    parts.scheduler.step()
    accumulate(window, step_metrics)
    return grad_norm


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int,
                   total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup to the peak lr, then cosine or linear decay to 0, or constant."""
    from transformers import get_scheduler

    name = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[kind]
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=max(total_steps, 1))
