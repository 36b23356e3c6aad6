"""One rank of a run: device, seed, data, draft model from the initializer, then the training loop."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch

from eagle3.data.loader import build_loaders
from eagle3.init import InitContext, build_draft
from eagle3.track import Tracker, format_result_table
from eagle3.train import train

log = logging.getLogger(__name__)


def pick_device(choice: str) -> torch.device:
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda but no CUDA device is available")
    return torch.device(choice)


def run_rank(cfg: dict[str, Any], verifier_dir: Path, data_dir: Path) -> dict[str, Any]:
    """Trains one draft as `cfg` (the resolved run config) says; returns the run summary."""
    run_dir = Path(cfg["run"]["dir"])
    device = pick_device(cfg["device"])
    torch.manual_seed(cfg["seed"])
    draft = cfg["model"]["draft"]
    attn_impl = draft["attn_impl"]
    if attn_impl == "auto":  # flex attention has no backward on CPU
        attn_impl = "simple_flex_attention" if device.type == "cuda" else "sdpa"

    train_loader, val_loader = build_loaders(
        data_dir,
        total_seq_len=cfg["data"]["total_seq_len"],
        hidden_size=draft["hidden_size"],
        num_aux_layers=len(draft["aux_layer_ids"]),
        train_ratio=cfg["data"]["train_ratio"],
        num_workers=cfg["data"]["num_workers"],
        # CPU computes in fp32 without autocast; on CUDA bf16 halves the host-to-device traffic.
        hidden_states_dtype=torch.bfloat16 if device.type == "cuda" else torch.float32,
        seed=cfg["seed"],
    )
    ctx = InitContext(draft=draft, init=cfg["init"], verifier_dir=verifier_dir, data_dir=data_dir, attn_impl=attn_impl)
    model, init_report = build_draft(ctx)
    model.to(device)
    (run_dir / "init_report.json").write_text(json.dumps(init_report, indent=2) + "\n")

    with Tracker(run_dir, cfg) as tracker:
        summary = train(model, train_loader, val_loader, cfg, device, tracker, run_dir)
        summary.update(verifier_dir=str(verifier_dir), data_dir=str(data_dir), device=str(device))
        tracker.finish(summary)
    log.info("results (val)\n%s", format_result_table(summary, draft["ttt_steps"]))
    log.info("run dir: %s", run_dir)
    return summary
