"""`train.on_policy` in the training loop: when a step runs rollouts, over which prompts, with which draws, and the
loss they add (eagle3/decoding/rollout.py makes the rows and the loss).

Every rank holds the whole verifier (data=online's, or one loaded like eval.accept's) and its own share of the
train split's prompts (the loss-masked-out start of each train row: every world-size-th one). The i-th rollout step
of a run decodes prompts i*n .. i*n+n-1 of that share (cyclically), sampling at T > 0 from a generator seeded by
the run's seed, the rank and i. Which prompts and which draws are thus functions of the optimizer step, so a resumed
run repeats exactly what the uninterrupted run does, and no rollout state needs to be checkpointed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from eagle3.config import OnPolicyConfig
from eagle3.decoding.drafting import Sampling
from eagle3.decoding.rollout import check_attention, rollout, rollout_loss
from eagle3.device.distributed import World, unwrap
from eagle3.errors import DataError

log = logging.getLogger(__name__)


class OnPolicy:
    """The rollout steps of one rank (module doc)."""

    def __init__(self, cfg: OnPolicyConfig, verifier: torch.nn.Module, prompts: Sequence[Sequence[int]], k: int,
                 aux_layer_ids: Sequence[int], seed: int, rank: int):
        if not prompts:
            raise DataError(f"train.on_policy: rank {rank} has no train prompt to decode (each rank takes every "
                            f"world-size-th train row that starts with loss-masked prompt tokens)")
        self.cfg, self.verifier, self.prompts, self.k = cfg, verifier, [list(p) for p in prompts], k
        self.aux_layer_ids, self.seed, self.rank = list(aux_layer_ids), seed, rank

    @property
    def mix(self) -> float:
        return self.cfg.mix

    def due(self, step: int) -> bool:
        """Whether the optimizer step after `step` done ones runs rollouts."""
        offset = step - self.cfg.start_step
        return offset >= 0 and offset % self.cfg.every == 0

    def loss(self, model: torch.nn.Module, step: int, loss_config: Any, ttt_step_loss_decay: float,
             autocast: AbstractContextManager[Any]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Rollouts of the draft as it is before the optimizer step after `step` done ones (decoded as eval.accept
        decodes, outside `autocast`), and their loss (with gradients, under `autocast`) and counted metrics."""
        draft = unwrap(model)
        index = (step - self.cfg.start_step) // self.cfg.every
        n = self.cfg.num_prompts
        prompts = [self.prompts[(index * n + i) % len(self.prompts)] for i in range(n)]
        sampling = Sampling(self.cfg.temperature, seed=draw_seed(self.seed, self.rank, index))
        rows = [rollout(self.verifier, draft, p, self.k, self.cfg.max_new_tokens, self.aux_layer_ids, sampling)
                for p in prompts]
        with autocast:
            return rollout_loss(draft, rows, loss_config, ttt_step_loss_decay)


def draw_seed(seed: int, rank: int, index: int) -> int:
    return ((seed * 1_000_003 + rank) * 1_000_003 + index) % 2**63


def train_split_prompts(data_dir: Path, train_ratio: float, rows: Sequence[int] | None,
                        max_len: int) -> list[list[int]]:
    """The loss-masked-out start of each train row (the split and the kept rows as the loader makes them) that has
    one and is at most `max_len` tokens long."""
    from eagle3.data.loader import split_rows
    from eagle3.formats.arrow_rows import ArrowRows

    arrow = ArrowRows(data_dir)
    prompts = []
    for i in split_rows(arrow, train_ratio, rows, data_dir)[0]["train"]:
        mask = arrow.loss_mask(int(i))
        start = int(mask.argmax()) if mask.any() else len(mask)
        if 0 < start < len(mask) and start <= max_len:
            prompts.append(arrow.input_ids(int(i))[:start].tolist())
    if not prompts:
        raise DataError(f"train.on_policy: no train row of {data_dir} starts with at most {max_len} loss-masked "
                        f"prompt tokens, so there is nothing to decode")
    return prompts


def build_on_policy(cfg: OnPolicyConfig, model: torch.nn.Module, verifier: torch.nn.Module | None,
                    verifier_dir: Path, data_dir: Path, train_ratio: float, rows: Sequence[int] | None,
                    k: int, device: torch.device, world: World, seed: int) -> OnPolicy:
    """This rank's OnPolicy for the (unwrapped) draft `model`: the verifier the run holds (data=online) or one
    loaded here, and this rank's share of the train prompts, short enough to leave room for the decoding."""
    from eagle3.decoding.aux_layers import aux_layer_ids
    from eagle3.decoding.drafting import check_draft
    from eagle3.verifier.model import Verifier

    check_draft(model)
    check_attention(model)
    if verifier is None:
        verifier = Verifier(verifier_dir).load(device)
    positions = getattr(verifier.config, "max_position_embeddings", None) or 1 << 30
    prompts = train_split_prompts(data_dir, train_ratio, rows, positions - cfg.max_new_tokens - k - 1)
    log.info("train.on_policy: from step %d, every %d steps, %d of this rank's %d train prompts decoded at T=%g, "
             "their loss mixed in at %g", cfg.start_step, cfg.every, cfg.num_prompts,
             len(prompts[world.rank::world.size]), cfg.temperature, cfg.mix)
    return OnPolicy(cfg, verifier, prompts[world.rank::world.size], k, aux_layer_ids(model, verifier), seed,
                    world.rank)
