"""The val pass: the draft's val metrics over the whole val split, the same for any world size or grad_accum
(each step's loss token-weighted over the split, accuracies as speculators counts them, tau_sim), and what it does
with val rows whose hidden states are not finite: refuse to rank a checkpoint by them, or leave them out
(data.on_bad_sample=skip). The loop (eagle3/train/loop.py) runs it at step 0 and as its Cadence says.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import torch

from eagle3.data.reader import to_device
from eagle3.device.distributed import World, reduce_sums
from eagle3.errors import RunStopped
from eagle3.eval.metric_sums import accumulate, summarize

__all__ = ["run_validation", "ValNotFinite", "not_finite_message", "nonfinite_documents", "without_documents",
           "val_counts"]


@torch.no_grad()
def run_validation(model: torch.nn.Module, loader: Iterable, device: torch.device, autocast,
                   call_kwargs: dict[str, Any], world: World = World(), *, on_bad_sample: str = "error",
                   where: str = "the val pass") -> dict[str, float]:
    """Val metrics of the weights over the whole val split (all ranks' shares), the same for any world size
    or grad_accum: each step's loss token-weighted over the split (`val_counts`), accuracies as speculators
    counts them, tau_sim from those, `loss` the sum of the step losses.

    A pass whose sums are not finite is never returned: it raises ValNotFinite on every rank alike (the check
    reads the sums reduced over ranks), naming `where`. With on_bad_sample="skip", documents whose hidden
    states are not finite are taken out of their micro-batch before the forward and counted in
    `skipped_rows`; then only weights that give a non-finite loss on finite inputs raise."""
    skip = on_bad_sample == "skip"
    sampler = getattr(loader, "batch_sampler", None)
    counted = getattr(sampler, "counted", None)  # ValShardSampler: the packs after these only keep ranks in step
    model.eval()
    sums: dict[str, Any] = {}
    bad_docs_by_pack: list[torch.Tensor] = []
    for i, batch in enumerate(loader):
        inputs = to_device(batch, device)
        bad_docs = nonfinite_documents(inputs)
        if skip:
            inputs = without_documents(inputs, bad_docs)
        with autocast:
            _, _, metrics = model(**inputs, **call_kwargs)
        counts = {**val_counts(metrics), "nonfinite_rows": bad_docs.sum()}
        if counted is not None and i >= counted:
            # A repeat: counted as nothing, but counted, so that every rank reduces the same keys.
            counts = {k: torch.zeros_like(v) for k, v in counts.items()}
        else:
            bad_docs_by_pack.append(bad_docs)
        accumulate(sums, counts)
    sums = reduce_sums(sums, world)
    nonfinite_rows = int(sums.pop("nonfinite_rows", 0))
    if not all(math.isfinite(v) for v in sums.values()):
        rows = []
        if nonfinite_rows and sampler is not None and hasattr(loader, "split_rows"):
            packs = list(sampler)
            rows = sorted(int(loader.split_rows[packs[i][s]]) for i, bad in enumerate(bad_docs_by_pack)
                          for s in bad.nonzero().flatten().tolist())
        from eagle3.data.online import OnlineLoader

        raise ValNotFinite(not_finite_message(where, nonfinite_rows, rows, world.rank,
                                              online=isinstance(loader, OnlineLoader)))
    metrics = summarize(sums)
    if skip:
        metrics["skipped_rows"] = nonfinite_rows
    return metrics


class ValNotFinite(RunStopped):
    """A val pass gave a non-finite loss or accuracy: it must never rank a checkpoint."""


def not_finite_message(where: str, nonfinite_rows: int, rows_here: list[int], rank: int, online: bool = False) -> str:
    kept = "Checkpoints saved before this pass are kept (checkpoints/last: the last resumable state)."
    if not nonfinite_rows:
        return (f"{where}: the val loss is not finite although every val row's hidden states are finite, so the "
                f"weights give it (diverged training or a broken init); it is not used to rank checkpoints. {kept} "
                f"Lower optim.lr or check init")
    shown = ", ".join(f"row {r}" if online else f"hs_{r}.safetensors" for r in rows_here[:5])
    more, where_rank = ", ..." if len(rows_here) > 5 else "", f" on rank {rank}" if rank else ""
    named = f" ({shown}{more}{where_rank})" if rows_here else ""
    held = "get non-finite hidden states from the verifier" if online else "hold non-finite hidden states"
    listing = "" if online else "; eagle3 check <data dir> lists every bad row"
    return (f"{where}: the val loss is not finite: {nonfinite_rows} val row(s) {held}{named}; it is not used to rank "
            f"checkpoints. {kept} data.on_bad_sample=skip leaves such rows out of validation (counted as skipped_rows "
            f"in each val row){listing}")


def nonfinite_documents(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """Which documents of a micro-batch (by document id, [T] bool) have a non-finite value in the hidden
    states the model reads for them. On the device, no sync."""
    doc = inputs["document_ids"][0]
    bad_positions = ~(torch.isfinite(inputs["hidden_states"][0]).all(-1)
                      & torch.isfinite(inputs["verifier_last_hidden_states"][0]).all(-1))
    # Slot 0 collects the padding (document id -1).
    per_doc = torch.zeros(doc.numel() + 1, device=doc.device).index_add_(0, doc + 1, bad_positions.float())
    return per_doc[1:] > 0


def without_documents(inputs: dict[str, torch.Tensor], bad_docs: torch.Tensor) -> dict[str, torch.Tensor]:
    """The micro-batch with `bad_docs` taken out: their hidden states zeroed (attention masks them from the
    other documents, but 0 x NaN would still reach them) and their positions out of the loss and accuracies."""
    doc = inputs["document_ids"]
    drop = torch.cat([bad_docs.new_zeros(1), bad_docs])[doc + 1]  # [1, T]
    out = dict(inputs)
    for k in ("hidden_states", "verifier_last_hidden_states"):
        out[k] = inputs[k].masked_fill(drop[..., None], 0)
    out["loss_mask"] = inputs["loss_mask"].masked_fill(drop, 0)
    return out


STEP_METRIC = re.compile(r"(.+)_(\d+)_sum")


def val_counts(metrics: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A micro-batch's metrics as counts that add up over any packing of the split (float64, on the device).

    speculators returns each step's loss (and loss term) as that micro-batch's mean over its loss-masked
    positions with a total of 1, so summing them weights a micro-batch, not a token, and the result depends on
    how the split is packed. Here each is weighted by the positions it averaged over (step k's full_acc_k
    total), and the whole-batch loss_sum (the sum of step means) is dropped: the summary's loss is then the
    sum over steps of the token-weighted step losses. The accuracy counts are already counts."""
    out = {}
    for key, value in metrics.items():
        match = STEP_METRIC.fullmatch(key)
        if match and match[1] not in ("full_acc", "cond_acc"):
            positions = metrics[f"full_acc_{match[2]}_total"].double()
            out[key] = value.detach().double() * positions
            out[f"{match[1]}_{match[2]}_total"] = positions
        elif key.endswith("_sum") or key.endswith("_total"):
            if key not in ("loss_sum", "loss_total") and key not in out:
                out[key] = value.detach().double()
    return out


