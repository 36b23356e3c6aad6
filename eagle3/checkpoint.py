"""Checkpoints in speculators' format (config.json + model.safetensors), which vLLM serves.

A checkpoint is written to a temporary sibling and renamed into place, so a crash during a save
never leaves a directory that fails to load.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch


def save_draft(model: torch.nn.Module, target: Path) -> Path:
    tmp = target.with_name(f".{target.name}.tmp")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def load_draft(path: str | Path, attn_impl: str = "sdpa", device: str | torch.device = "cpu"):
    """Loads a speculators checkpoint with an attention implementation that works on `device`.

    speculators does not save the attention implementation and falls back to flex attention, which has
    no backward on CPU, so the config is loaded first and told which one to use.
    """
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = attn_impl
    model = Eagle3DraftModel.from_pretrained(str(path), config=config)
    return model.to(device)
