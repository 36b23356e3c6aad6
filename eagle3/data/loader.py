"""Reading a speculators-format dataset: speculators' reader, collate and packing sampler, plus the vocab map."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import DataLoader


def build_loaders(data_dir: Path, total_seq_len: int, hidden_size: int, num_aux_layers: int,
                  train_ratio: float, num_workers: int, hidden_states_dtype: torch.dtype,
                  seed: int) -> tuple[DataLoader, DataLoader]:
    """Train and val loaders of packed batches `[1, total_seq_len, ...]`, already shifted for EAGLE-3.

    Sharding across ranks follows speculators' process-group state (one shard when it is not initialised).
    """
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.dataloader import create_train_val_loaders

    return create_train_val_loaders(
        data_path=str(data_dir),
        total_seq_len=total_seq_len,
        hidden_states_dtype=hidden_states_dtype,
        # Offline data only: a sample whose hidden-state file is missing is an error, never a vLLM request.
        vllm_endpoint="",
        on_missing="raise",
        verifier_name_or_path="",
        request_timeout=None,
        max_retries=0,
        generation_validation_retries=0,
        max_consecutive_generation_failures=1,
        hidden_size=hidden_size,
        num_target_layers=num_aux_layers,
        num_workers=num_workers,
        prefetch_factor=2,
        preprocess=shift_batch,
        train_data_ratio=train_ratio,
        seed=seed,
    )


def vocab_mapping(data_dir: Path, draft_vocab_size: int, target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d) from the data's token frequencies: the draft vocabulary is the most frequent loss tokens."""
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = torch.load(data_dir / "token_freq.pt", weights_only=True)
    return build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
