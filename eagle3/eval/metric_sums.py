"""speculators' counted metrics summed over micro-batches and turned into the ratios a train or val row reports
(tau_sim among them): the loop's sums, and the teacher-forced estimate's."""

from __future__ import annotations

import re
from typing import Any

import torch


def accumulate(into: dict[str, Any], metrics: dict[str, torch.Tensor]) -> None:
    """Adds speculators' counted metrics (`<name>_sum`, `<name>_total`) into running sums. They stay tensors
    on the device: reading one would wait for the GPU at every step."""
    for k, v in metrics.items():
        into[k] = into.get(k, 0.0) + v.detach()


def summarize(sums: dict[str, float]) -> dict[str, float]:
    """Ratios of the counted metrics (train rows: speculators' per-micro-batch means, averaged over the window's
    micro-batches; val rows: token-weighted, see eagle3.train.validation.val_counts), and
    tau_sim = 1 + sum_k full_acc_k (simulated chain acceptance length)."""
    from speculators.train.utils import normalize_counted_metrics

    metrics = normalize_counted_metrics(dict(sums))
    if "loss" not in metrics:  # the val pass's counts (val_counts): the loss is the sum of the step losses
        metrics["loss"] = sum(v for k, v in metrics.items() if re.fullmatch(r"loss_\d+", k))
    metrics["tau_sim"] = 1.0 + sum(v for k, v in metrics.items() if k.startswith("full_acc_"))
    return metrics
