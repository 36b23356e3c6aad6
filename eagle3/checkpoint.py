"""Checkpoints in speculators' format (config.json + model.safetensors), which vLLM serves.

`checkpoints/last` also holds `trainer_state.pt` (optimizer, scheduler, step, data position, RNG) for
resume. A checkpoint is written to a temporary sibling and renamed into place, so a kill during a save
never leaves a directory that fails to load.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch

TRAINER_STATE = "trainer_state.pt"


def save_checkpoint(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], target: Path,
                    trainer_state: dict[str, Any] | None = None) -> Path:
    """Writes `state_dict` through `model.save_pretrained` (plus the trainer state, if given) atomically."""
    tmp = target.with_name(f".{target.name}.tmp")
    old = target.with_name(f".{target.name}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), state_dict=state_dict)
    if trainer_state is not None:
        torch.save(trainer_state, tmp / TRAINER_STATE)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def check_disk(run_dir: Path, model: torch.nn.Module) -> None:
    """Refuses to start when the run dir's filesystem cannot hold two checkpoints (`last` with its optimizer
    state, and `best`), so that a long run does not die at its first save."""
    from eagle3.errors import ConfigError

    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    optimizer = sum(2 * p.numel() * 4 for p in model.parameters() if p.requires_grad)  # AdamW's two fp32 moments
    needed = 2 * (2 * weights + optimizer)
    free = shutil.disk_usage(run_dir).free
    if free < needed:
        raise ConfigError(f"{run_dir}: {free / 2**30:.2f} GiB free, but the checkpoints of this run need about "
                          f"{needed / 2**30:.2f} GiB (last with optimizer state, and best, each written beside "
                          "the previous one before it is replaced); free space or choose another hydra.run.dir")


def load_trainer_state(checkpoint: Path) -> dict[str, Any]:
    return torch.load(checkpoint / TRAINER_STATE, map_location="cpu", weights_only=True)


def load_draft(path: str | Path, attn_impl: str = "sdpa", device: str | torch.device = "cpu",
               verifier_dir: str | Path | None = None):
    """Loads a speculators checkpoint with an attention implementation that works on `device`.

    speculators does not save the attention implementation and falls back to flex attention, which has
    no backward on CPU, so the config is loaded first and told which one to use. `verifier_dir` replaces the
    verifier path the checkpoint recorded: speculators reads the verifier's lm_head and norm (not saved in
    the checkpoint) and checks the aux layer ids from there.
    """
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    config = Eagle3SpeculatorConfig.from_pretrained(str(path))
    config.transformer_layer_config._attn_implementation = attn_impl
    if verifier_dir is not None:
        config.speculators_config.verifier.name_or_path = str(verifier_dir)
    model = Eagle3DraftModel.from_pretrained(str(path), config=config)
    return model.to(device)
