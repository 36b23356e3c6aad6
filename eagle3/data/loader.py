"""Reading a speculators-format dataset: speculators' reader, collate and packing sampler, plus the vocab map.

Sharding: a step consumes `world_size * grad_accum` packed micro-batches, and speculators' packing sampler
is asked for exactly that many replicas; rank r takes micro-replicas r*A .. r*A+A-1. So a 2-rank job and a
1-process job with grad_accum=2 see the same micro-batches in every step, and the global batch in tokens
stays fixed when the world size changes with grad_accum.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Sampler


class ShardedBatchSampler(Sampler):
    """This rank's packed micro-batches, in step order (A micro-batches per step), with a resumable start."""

    def __init__(self, lengths: list[int], total_seq_len: int, world_size: int, rank: int, grad_accum: int,
                 seed: int):
        from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

        replicas = world_size * grad_accum
        self.samplers = [
            MultipackDistributedBatchSamplerV2(total_seq_len, lengths, num_replicas=replicas,
                                               rank=rank * grad_accum + a, seed=seed)
            for a in range(grad_accum)
        ]
        self.skip = 0

    @property
    def steps(self) -> int:
        """Optimizer steps per epoch (the same on every rank: the packing is computed for all of them)."""
        return len(self.samplers[0])

    def set_epoch(self, epoch: int, skip_steps: int = 0) -> None:
        for s in self.samplers:
            s.set_epoch(epoch)
        self.skip = skip_steps * len(self.samplers)

    def __len__(self) -> int:
        return self.steps * len(self.samplers) - self.skip

    def __iter__(self) -> Iterator[list[int]]:
        per_sampler = [list(s) for s in self.samplers]
        micro_batches = [batch for step in zip(*per_sampler) for batch in step]
        return iter(micro_batches[self.skip:])


def build_loaders(data_dir: str | Path, total_seq_len: int, hidden_size: int, num_aux_layers: int,
                  train_ratio: float, num_workers: int, hidden_states_dtype: torch.dtype, seed: int,
                  world_size: int = 1, rank: int = 0, grad_accum: int = 1,
                  rows: list[int] | None = None) -> tuple[DataLoader, DataLoader]:
    """Train and val loaders of packed, EAGLE-3-shifted micro-batches `[1, total_seq_len, ...]` for this rank."""
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn

    def loader(split: str, sampler_seed: int) -> DataLoader:
        # Offline data only: a missing hidden-state file is an error, never a request to a vLLM server.
        dataset = ArrowDataset(max_len=total_seq_len, datapath=str(data_dir), on_missing="raise",
                               train_ratio=train_ratio, split=split, hidden_states_dtype=hidden_states_dtype)
        if rows is not None:
            dataset = _Rows(dataset, rows)
        sampler = ShardedBatchSampler(dataset.approx_lengths, total_seq_len, world_size, rank, grad_accum,
                                      sampler_seed)
        workers = num_workers > 0
        return DataLoader(
            dataset,
            batch_sampler=sampler,
            num_workers=num_workers,
            collate_fn=CollateFn(total_seq_len, hidden_size, num_target_layers=num_aux_layers,
                                 dtype=hidden_states_dtype, preprocess=shift_batch),
            pin_memory=torch.cuda.is_available(),
            persistent_workers=workers,
            prefetch_factor=2 if workers else None,
            multiprocessing_context="spawn" if workers else None,
        )

    # Validation keeps one fixed order, so that runs with different seeds are compared on the same batches.
    return loader("train", seed), loader("val", 0)


class _Rows(torch.utils.data.Dataset):
    """The listed full-dataset rows of one split of an ArrowDataset."""

    def __init__(self, dataset, rows: list[int]):
        start, stop = dataset.start_file_idx, dataset.start_file_idx + len(dataset)
        self.dataset, self.keep = dataset, [r - start for r in rows if start <= r < stop]
        self.approx_lengths = [dataset.approx_lengths[i] for i in self.keep]

    def __len__(self) -> int:
        return len(self.keep)

    def __getitem__(self, index: int):
        return self.dataset[self.keep[index]]
