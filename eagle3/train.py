"""The training loop: AdamW, warmup + decay, clipping, a val pass before any update and after each epoch,
checkpoints `last` and `best` (highest val tau_sim). Runs on CPU or one GPU; speculators' own Trainer is
CUDA-only.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from eagle3.checkpoint import save_draft
from eagle3.track import Tracker

log = logging.getLogger(__name__)


def train(model: torch.nn.Module, train_loader: DataLoader, val_loader: DataLoader, cfg: dict[str, Any],
          device: torch.device, tracker: Tracker, run_dir: Path) -> dict[str, Any]:
    """Trains `model` as `cfg` says and returns the run summary (also written by the tracker)."""
    from speculators.losses import resolve_loss_config

    optim_cfg, draft_cfg = cfg["optim"], cfg["model"]["draft"]
    is_rank0 = tracker.enabled
    call_kwargs = {
        "ttt_steps": draft_cfg["ttt_steps"],
        "ttt_step_loss_decay": draft_cfg["ttt_step_loss_decay"],
        # The fused loss is Triton: CUDA only.
        "loss_config": resolve_loss_config(draft_cfg["loss"], "fused" if device.type == "cuda" else "eager"),
    }
    autocast = (torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext())

    steps_per_epoch = len(train_loader)
    total_steps = optim_cfg["epochs"] * steps_per_epoch
    if optim_cfg["max_steps"] is not None:
        total_steps = min(total_steps, optim_cfg["max_steps"])
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=optim_cfg["lr"], betas=tuple(optim_cfg["betas"]),
                                  weight_decay=optim_cfg["weight_decay"])
    scheduler = make_scheduler(optimizer, optim_cfg["scheduler"], math.ceil(optim_cfg["warmup_ratio"] * total_steps),
                               total_steps)
    ckpt_dir = run_dir / "checkpoints"
    log.info("training %s parameters for %d steps (%d per epoch), lr %.2g", f"{sum(p.numel() for p in trainable):,}",
             total_steps, steps_per_epoch, optim_cfg["lr"])

    def evaluate(step: int, epoch: int) -> dict[str, Any]:
        metrics = run_validation(model, val_loader, device, autocast, call_kwargs)
        row = {"step": step, "split": "val", "epoch": epoch, **metrics}
        tracker.log(row)
        return row

    # Step 0: the drafter as initialized, before any update. For a pretrained init this is its probe.
    step0 = best = evaluate(0, 0)
    if is_rank0:
        save_draft(model, ckpt_dir / "best")
    final, step, tokens, start = step0, 0, 0, time.perf_counter()
    window: dict[str, float] = {}
    progress = tqdm(total=total_steps, desc="train", unit="step", disable=not is_rank0, dynamic_ncols=True)
    model.train()
    for epoch in range(optim_cfg["epochs"]):
        if step >= total_steps:
            break
        train_loader.batch_sampler.set_epoch(epoch)
        for batch in train_loader:
            if step >= total_steps:
                break
            batch = to_device(batch, device)
            with autocast:
                _, loss, metrics = model(**batch, **call_kwargs)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = torch.nn.utils.clip_grad_norm_(trainable, optim_cfg["grad_clip"])
            optimizer.step()
            scheduler.step()
            step += 1
            tokens += int((batch["document_ids"] >= 0).sum())
            accumulate(window, metrics)
            progress.update()
            if step % cfg["logger"]["log_every"] == 0 or step == total_steps:
                row = {"step": step, "split": "train", "epoch": epoch, **summarize(window),
                       "lr": scheduler.get_last_lr()[0], "grad_norm": float(grad_norm),
                       "tokens_per_s": tokens / (time.perf_counter() - start)}
                tracker.log(row)
                progress.set_postfix(loss=f"{row['loss']:.3f}", acc0=f"{row.get('full_acc_0', 0):.3f}")
                window = {}
        final = evaluate(step, epoch + 1)
        model.train()
        if is_rank0:
            save_draft(model, ckpt_dir / "last")
            if final["tau_sim"] > best["tau_sim"]:
                best = final
                save_draft(model, ckpt_dir / "best")
    progress.close()
    wall = time.perf_counter() - start
    if is_rank0 and not (ckpt_dir / "last").exists():  # max_steps=0: the probe alone
        save_draft(model, ckpt_dir / "last")
    return {
        "steps": step,
        "tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "train_wall_s": wall,
        "step0": step0,
        "final": final,
        "best": best,
        "checkpoints": {"last": str(ckpt_dir / "last"), "best": str(ckpt_dir / "best")},
    }


def make_scheduler(optimizer: torch.optim.Optimizer, kind: str, warmup_steps: int,
                   total_steps: int) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup to the peak lr, then cosine or linear decay to 0, or constant."""
    from transformers import get_scheduler

    name = {"cosine": "cosine", "linear": "linear", "constant": "constant_with_warmup"}[kind]
    return get_scheduler(name, optimizer, num_warmup_steps=warmup_steps, num_training_steps=max(total_steps, 1))


@torch.no_grad()
def run_validation(model: torch.nn.Module, loader: Iterable, device: torch.device, autocast,
                   call_kwargs: dict[str, Any]) -> dict[str, float]:
    """Token-weighted val metrics over the whole loader, plus tau_sim."""
    model.eval()
    sums: dict[str, float] = {}
    for batch in loader:
        with autocast:
            _, _, metrics = model(**to_device(batch, device), **call_kwargs)
        accumulate(sums, metrics)
    return summarize(sums)


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}


def accumulate(into: dict[str, float], metrics: dict[str, torch.Tensor]) -> None:
    """Adds speculators' counted metrics (`<name>_sum`, `<name>_total`) into running sums."""
    for k, v in metrics.items():
        into[k] = into.get(k, 0.0) + float(v)


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """Ratios of the counted metrics, and tau_sim = 1 + sum_k full_acc_k (simulated chain acceptance length)."""
    from speculators.train.utils import normalize_counted_metrics

    metrics = normalize_counted_metrics(dict(sums))
    metrics["tau_sim"] = 1.0 + sum(v for k, v in metrics.items() if k.startswith("full_acc_"))
    return metrics
