"""Safetensors headers, read without torch: which tensors a file holds, their dtypes, shapes and byte ranges.

A safetensors file is an 8-byte little-endian header size, a JSON header (dtype, shape and data offsets,
relative to the header's end, of every tensor), then the data. Checkpoints (eagle3/init/files.py) and
hidden-state files (eagle3/data/hsfiles.py) are both checked through here before any tensor is read.
"""

from __future__ import annotations

import json
import os
from typing import NamedTuple

MAX_HEADER = 100 * 2**20  # safetensors' own limit


class HeaderError(ValueError):
    """What is wrong with a file that should be safetensors; the caller adds the file's name."""


class TensorSpec(NamedTuple):
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def read_specs(fd: int) -> dict[str, TensorSpec]:
    """The tensors of the open safetensors file `fd`, checked against the file's size."""
    size = os.fstat(fd).st_size
    head = os.pread(fd, 8, 0)
    if len(head) < 8:
        raise HeaderError(f"not a safetensors file (only {size} bytes)")
    header_len = int.from_bytes(head, "little")
    if header_len > min(size - 8, MAX_HEADER):
        raise HeaderError("not a safetensors file (its first 8 bytes do not give a header length)")
    try:
        header = json.loads(os.pread(fd, header_len, 8))
    except (UnicodeDecodeError, ValueError):
        raise HeaderError("not a safetensors file (its header is not JSON)") from None
    base = 8 + header_len
    try:
        tensors = {name: TensorSpec(t["dtype"], tuple(t["shape"]), base + t["data_offsets"][0],
                                    base + t["data_offsets"][1])
                   for name, t in header.items() if name != "__metadata__"}
    except (AttributeError, KeyError, TypeError, IndexError) as e:
        raise HeaderError(f"not a safetensors file (its header does not list dtype, shape and offsets: "
                          f"{e!r})") from None
    needed = max((t.end for t in tensors.values()), default=base)
    if needed > size:
        raise HeaderError(f"truncated: its header needs {needed:,} bytes, the file has {size:,}")
    return tensors
