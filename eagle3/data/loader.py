"""Reading a speculators-format dataset: the split, the packing of its rows into micro-batches and steps
(eagle3/formats/packing.py: best-fit decreasing, the same number of steps in every epoch, every row in exactly one
micro-batch of each) and this project's reader (eagle3.data.reader).

Sharding: a step consumes `world_size * grad_accum` packed micro-batches, and the epoch is packed for exactly that
many replicas; rank r takes micro-replicas r*A .. r*A+A-1 of each step. So a 2-rank job and a 1-process job with
grad_accum=2 see the same micro-batches in every step, and the global batch in tokens stays fixed when the world
size changes with grad_accum.

Validation is not a step: its split is packed once, as for one replica (every val row in exactly one pack,
the same packs for any world size or grad_accum), and rank r takes packs r, r + W, r + 2W, ... Ranks whose
share is one pack short repeat a pack at the end so that every rank runs the same number of forwards (DDP's
buffer broadcast and FSDP's all-gathers are collectives); `ValShardSampler.counted` says how many count.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import numpy as np
import torch
from torch.utils.data import Sampler

from eagle3.data.reader import PackedLoader
from eagle3.errors import DataError
from eagle3.formats.arrow_rows import ArrowRows
from eagle3.formats.hidden_states import file_dtype
from eagle3.formats.packing import epoch_packs, steps_per_epoch

if TYPE_CHECKING:
    from eagle3.data.online import HiddenStore, OnlineLoader, OnlineVerifier

    Loader: TypeAlias = PackedLoader | OnlineLoader


class ShardedBatchSampler(Sampler):
    """This rank's packed micro-batches, in step order (A micro-batches per step), with a resumable start."""

    def __init__(self, lengths: list[int], total_seq_len: int, world_size: int, rank: int, grad_accum: int,
                 seed: int):
        self.lengths, self.total_seq_len, self.seed = np.asarray(lengths, dtype=np.int64), total_seq_len, seed
        self.replicas, self.grad_accum = world_size * grad_accum, grad_accum
        self.first = rank * grad_accum  # this rank's micro-replicas: first .. first + grad_accum - 1
        self.steps = steps_per_epoch(self.lengths, total_seq_len, self.replicas)
        """Optimizer steps in every epoch (the same on every rank and in every epoch: eagle3/formats/packing.py)."""
        self.epoch, self.skip = 0, 0

    def set_epoch(self, epoch: int, skip_steps: int = 0) -> None:
        self.epoch, self.skip = epoch, skip_steps

    def __len__(self) -> int:
        return (self.steps - self.skip) * self.grad_accum

    def __iter__(self) -> Iterator[list[int]]:
        packs = epoch_packs(self.lengths, self.total_seq_len, self.replicas, self.seed, self.epoch)
        for step in range(self.skip, self.steps):
            start = step * self.replicas + self.first
            yield from packs[start:start + self.grad_accum]


class ValShardSampler(Sampler):
    """This rank's share of the val packs (see the module doc): the first `counted` are its own, then repeats
    of a pack to keep the forward count equal on every rank, whose metrics the val pass must not count."""

    def __init__(self, lengths: list[int], total_seq_len: int, world_size: int, rank: int):
        # One replica, so no pack is split; a fixed seed: runs with different seeds are compared on the same packs.
        packs = epoch_packs(lengths, total_seq_len, 1, seed=0, epoch=0)
        own = packs[rank::world_size]
        self.counted = len(own)
        per_rank = -(-len(packs) // world_size)
        self.packs = own + [packs[0]] * (per_rank - len(own))

    def set_epoch(self, epoch: int, skip_steps: int = 0) -> None:
        """Validation has one fixed order: the same packs in every pass."""

    def __len__(self) -> int:
        return len(self.packs)

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.packs)


def split_rows(arrow: ArrowRows, train_ratio: float, rows: Sequence[int] | None,
               data_dir: str | Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The train and val rows (indices into the whole dataset), and all rows kept; see build_loaders."""
    split_idx = int(len(arrow) * train_ratio)
    kept = np.arange(len(arrow)) if rows is None else np.unique(np.asarray(rows, dtype=np.int64))
    if len(kept) and not 0 <= kept[0] <= kept[-1] < len(arrow):
        raise ValueError(f"rows: indices must be in [0, {len(arrow)}), got {kept[0]} .. {kept[-1]}")
    splits = {"train": kept[kept < split_idx], "val": kept[kept >= split_idx]}
    for split, in_split in splits.items():
        if not len(in_split):
            raise DataError(f"{data_dir}: the {split} split is empty ({len(arrow)} rows, train_ratio "
                            f"{train_ratio}, {len(kept)} rows kept)")
    return splits, kept


def train_lengths(data_dir: str | Path, train_ratio: float, rows: Sequence[int] | None = None) -> np.ndarray:
    """The token counts of the train split's rows, which its packing (eagle3/formats/packing.py) counts steps of."""
    arrow = ArrowRows(data_dir)
    splits, _ = split_rows(arrow, train_ratio, rows, data_dir)
    return arrow.seq_len[splits["train"]]


@dataclass(frozen=True)
class LoaderSpec:
    """How a rank's loaders split, pack, shard and place the rows (build_loaders).

    The split is speculators' ArrowDataset's: the first int(len(dataset) * train_ratio) rows train, the rest
    validate. `rows` (indices into the whole dataset) keeps only those rows in either split, without moving the
    boundary: a start-up check drops bad rows this way. Micro-batches of `total_seq_len` tokens carry
    `num_aux_layers` aux hidden states of `hidden_size`; `seed` shuffles the train packing; a step takes
    `grad_accum` micro-batches on each of `world_size` ranks (this one: `rank`). `prefetch`: micro-batches read
    ahead from files; `device`: where they go (CUDA: page-locked buffers); `hidden_states_dtype`: what hidden
    states computed in the loop (data=online) are rounded to."""

    total_seq_len: int
    hidden_size: int
    num_aux_layers: int
    train_ratio: float
    seed: int
    world_size: int = 1
    rank: int = 0
    grad_accum: int = 1
    prefetch: int = 2
    rows: Sequence[int] | None = None
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    hidden_states_dtype: torch.dtype = torch.bfloat16


def build_loaders(data_dir: str | Path, spec: LoaderSpec, verifier: OnlineVerifier | None = None,
                  train_store: HiddenStore | None = None) -> tuple[Loader, Loader]:
    """Train and val loaders of this rank's packed, EAGLE-3-shifted micro-batches (see eagle3.data.reader), as
    `spec` says. Row i's hidden states are hidden_states/hs_<i>.safetensors, or with a `verifier` (data=online)
    computed by it (eagle3.data.online); data_dir then needs only the Arrow rows. `train_store` (with a verifier,
    data.cache_gb): where the train split keeps each row's hidden states for the epochs after the first.
    """
    total_seq_len, hidden_size, num_aux_layers = spec.total_seq_len, spec.hidden_size, spec.num_aux_layers
    world_size, rank, grad_accum, seed = spec.world_size, spec.rank, spec.grad_accum, spec.seed
    prefetch, device, hidden_states_dtype, train_ratio, rows = (spec.prefetch, spec.device, spec.hidden_states_dtype,
                                                               spec.train_ratio, spec.rows)
    arrow = ArrowRows(data_dir)
    splits, kept = split_rows(arrow, train_ratio, rows, data_dir)

    def loader(split: str, sampler: Sampler) -> Loader:
        if verifier is not None:
            from eagle3.data.online import VAL_KEEP_BYTES, HiddenStore, OnlineLoader

            # The val split's hidden states are computed once per run and read back by every later val pass
            # (a sharded verifier's forward is a collective: every rank runs it at every pass, none kept).
            store = HiddenStore(VAL_KEEP_BYTES) if split == "val" and not verifier.sharded else None
            return OnlineLoader(verifier, arrow, splits[split], sampler, total_seq_len, num_aux_layers, hidden_size,
                                hidden_states_dtype, store, train_store if split == "train" else None)
        return PackedLoader(Path(data_dir), arrow, splits[split], sampler, total_seq_len, hidden_size, num_aux_layers,
                            file_dtype(Path(data_dir), int(kept[0])), prefetch, torch.device(device))

    def lengths(split: str) -> list[int]:
        return arrow.seq_len[splits[split]].tolist()

    train = loader("train", ShardedBatchSampler(lengths("train"), total_seq_len, world_size, rank, grad_accum, seed))
    val = loader("val", ValShardSampler(lengths("val"), total_seq_len, world_size, rank))
    train.check_row(int(kept[0]))  # a draft shape that does not fit the data stops the run here, not mid-step
    return train, val
