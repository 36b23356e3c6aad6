"""The Arrow rows of a speculators-format dataset (input_ids, loss_mask, seq_len), read without per-row overhead.

`datasets`' `__getitem__` formats one row at a time through its Python formatting; here every row is a numpy
view of the memory-mapped Arrow column, so a batch's token ids cost a slice.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


class ArrowRows:
    """Rows of the dataset saved at `data_dir` with `datasets.save_to_disk`, indexed as in the full dataset."""

    def __init__(self, data_dir: str | Path):
        from datasets import load_from_disk

        table = load_from_disk(str(data_dir)).data.table
        self.seq_len: np.ndarray = table.column("seq_len").to_numpy()
        self._columns = {name: _ListColumn(table.column(name)) for name in ("input_ids", "loss_mask")}

    def __len__(self) -> int:
        return len(self.seq_len)

    def input_ids(self, row: int) -> np.ndarray:
        return self._columns["input_ids"][row]

    def loss_mask(self, row: int) -> np.ndarray:
        return self._columns["loss_mask"][row]


class _ListColumn:
    """A list column as per-chunk (offsets, values) numpy arrays over the Arrow buffers (no copy)."""

    def __init__(self, column):
        self.chunks = [(chunk.offsets.to_numpy(), chunk.values.to_numpy(zero_copy_only=True))
                       for chunk in column.chunks]
        self.starts = np.cumsum([0] + [len(chunk) for chunk in column.chunks])

    def __getitem__(self, row: int) -> np.ndarray:
        c = int(np.searchsorted(self.starts, row, side="right")) - 1
        offsets, values = self.chunks[c]
        i = row - self.starts[c]
        return values[offsets[i]:offsets[i + 1]]
