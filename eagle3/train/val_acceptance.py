"""`eval.accept` in a training run: measured acceptance added to the val rows (val/accept_len in wandb).

Rank 0 holds the verifier (loaded once per run, or the one the run already holds: data=online's, on-policy
rollouts') and the prompts, and measures the unwrapped draft; the other ranks wait at a barrier, so all ranks
leave the val pass together. FSDP across ranks is refused by AcceptEvalConfig.check(): rank 0 would hold only a
shard.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from eagle3.config import AcceptEvalConfig
from eagle3.device.distributed import World, barrier, unwrap
from eagle3.device.threads import torch_threads
from eagle3.eval.measure import AcceptanceProbe, LosslessError

log = logging.getLogger(__name__)


class AcceptanceAtVal:
    def __init__(self, accept: AcceptEvalConfig, train_ratio: float, verifier_dir: Path, data_dir: Path,
                 device: torch.device, world: World, *, seed: int, verifier: torch.nn.Module | None = None):
        """`train_ratio` (data.train_ratio) says where the val split starts, whose prompts are used by default;
        `seed` (the run's seed) seeds the sampling at eval.accept.temperature > 0, the same at every val pass.
        `verifier`: the one the run already holds (data=online, or on-policy rollouts'), not a second copy."""
        from eagle3.eval.prompts import read_prompts_file, val_split_prompts
        from eagle3.verifier.model import Verifier

        self.every, self.world, self.passes = accept.every, world, 0
        self.threads = 1 if device.type == "cpu" else None  # see torch_threads
        self.probe: AcceptanceProbe | None = None
        if not world.is_main:
            return
        if accept.prompts is not None:
            prompts = read_prompts_file(accept.prompts, verifier_dir, accept.num_prompts)
        else:
            prompts = val_split_prompts(data_dir, train_ratio, accept.num_prompts)
        if verifier is None:
            verifier = Verifier(verifier_dir).load(str(device))
        self.probe = AcceptanceProbe(verifier, prompts, accept.k,
                                     accept.max_new_tokens, accept.temperature, seed)

    def __call__(self, model: torch.nn.Module) -> dict[str, Any]:
        """The accept_* entries of this val pass's row (none at passes that `every` skips)."""
        self.passes += 1
        if (self.passes - 1) % self.every:
            return {}
        row: dict[str, Any] = {}
        if self.probe is not None:
            try:
                with torch_threads(self.threads):
                    result = self.probe.measure(unwrap(model), teacher_forced=False)
            except LosslessError as e:
                # The weights are fine, the measurement is not: say so loudly, log no number, keep training.
                log.error("eval.accept: %s", e)
                row = {"accept_lossless": False}
            else:
                row = {"accept_len": result["accept_len"],
                       **{f"accept_rate_{j}": r for j, r in enumerate(result["accept_rate"])},
                       "accept_s": result["wall_s"]}
        barrier(self.world)
        return row
