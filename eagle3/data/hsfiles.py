"""speculators' hidden-state files, read without safetensors' mmap: the header, checks, reads into a buffer.

    hidden_states/hs_<row>.safetensors: hidden_states [seq_len, n_aux + 1, H] (float), token_ids [seq_len] (int)

A safetensors file is an 8-byte little-endian header size, a JSON header (dtype, shape and data offsets,
relative to the header's end, of every tensor), then the data.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from eagle3.config import ConfigError

FLOAT_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
INT_DTYPES = {"I64": np.int64, "I32": np.int32}
MAX_HEADER = 100 * 2**20  # safetensors' own limit


class DataError(ConfigError):
    """A hidden-state file is missing, unreadable, or disagrees with its Arrow row or the draft's shape."""


class TensorSpec(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def hs_path(data_dir: Path, row: int) -> Path:
    return Path(data_dir) / "hidden_states" / f"hs_{row}.safetensors"


def open_file(path: Path, row: int) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise DataError(f"{path}: missing (the hidden states of row {row}); the data changed after the run's "
                        f"start-up check, or that check did not run") from None


def read_header(fd: int, path: Path) -> dict[str, TensorSpec]:
    """The tensors a safetensors file holds, with their absolute byte ranges."""
    size = int.from_bytes(os.pread(fd, 8, 0), "little")
    try:
        if size > MAX_HEADER:
            raise ValueError(f"header size {size}")
        header = json.loads(os.pread(fd, size, 8))
        return {name: TensorSpec(t["dtype"], tuple(t["shape"]), 8 + size + t["data_offsets"][0],
                                 8 + size + t["data_offsets"][1])
                for name, t in header.items() if name != "__metadata__"}
    except (ValueError, KeyError, TypeError, IndexError) as e:
        raise DataError(f"{path}: not a readable safetensors file ({e!r})") from None


def file_dtype(data_dir: Path, row: int) -> torch.dtype:
    """The dtype of one row's hidden states: the dataset's, which every file read is checked against."""
    path = hs_path(data_dir, row)
    fd = open_file(path, row)
    try:
        spec = read_header(fd, path).get("hidden_states")
    finally:
        os.close(fd)
    if spec is None or spec.dtype not in FLOAT_DTYPES:
        raise DataError(f"{path}: hidden_states is {spec and spec.dtype}, expected one of {sorted(FLOAT_DTYPES)}")
    return FLOAT_DTYPES[spec.dtype]


def check_file(fd: int, path: Path, row: int, ids: np.ndarray, dtype: torch.dtype, num_aux: int,
               hidden_size: int) -> int:
    """Checks a file's header and token ids against its row and the draft's shape; returns where its hidden
    states start. Reads the header and token_ids (16 KB at 2048 tokens), not the hidden states."""
    tensors = read_header(fd, path)
    hs, tok = tensors.get("hidden_states"), tensors.get("token_ids")
    if hs is None or tok is None:
        raise DataError(f"{path}: expected tensors hidden_states and token_ids, found {sorted(tensors)}")
    name = {v: k for k, v in FLOAT_DTYPES.items()}[dtype]
    n, want = len(ids), (len(ids), num_aux + 1, hidden_size)
    if hs.dtype != name or hs.shape != want:
        raise DataError(f"{path}: hidden_states is {hs.dtype} {list(hs.shape)}, expected {name} {list(want)} "
                        f"(row {row}'s {n} tokens, {num_aux} aux layers + the last, hidden size {hidden_size}; "
                        f"the dtype of the dataset's first file)")
    if tok.dtype not in INT_DTYPES or tok.shape != (n,):
        raise DataError(f"{path}: token_ids is {tok.dtype} {list(tok.shape)}, expected [{n}] integers")
    token_ids = np.frombuffer(os.pread(fd, tok.end - tok.start, tok.start), INT_DTYPES[tok.dtype])
    if not np.array_equal(token_ids, ids):
        raise DataError(f"{path}: token_ids differ from row {row}'s input_ids; the data changed after the run's "
                        f"start-up check")
    return hs.start


def read_into(fd: int, dest: memoryview, offset: int, path: Path) -> None:
    """Fills `dest` from the file at `offset` (preadv releases the GIL); a short file is an error."""
    done = 0
    while done < len(dest):
        n = os.preadv(fd, [dest[done:]], offset + done)
        if n == 0:
            raise DataError(f"{path}: truncated ({offset + done} bytes, the header promises more)")
        done += n
