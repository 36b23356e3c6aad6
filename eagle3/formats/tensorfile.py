"""Safetensors headers, read without torch: which tensors a file holds, their dtypes, shapes and byte ranges.

A safetensors file is an 8-byte little-endian header size, a JSON header (dtype, shape and data offsets,
relative to the header's end, of every tensor), then the data. Checkpoints (eagle3/init/files.py) and
hidden-state files (eagle3/formats/hidden_states.py) are both checked through here before any tensor is read.

`weight_files(dir)` is the one reader of a Hugging Face model dir's safetensors index (model.safetensors.index.json),
for draft checkpoints and verifiers alike.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import NamedTuple

MAX_HEADER = 100 * 2**20  # safetensors' own limit
# Bits per element of each dtype safetensors knows (its Dtype enum).
DTYPE_BITS = {"BOOL": 8, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8,
              "F8_E8M0": 8, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "I16": 16, "U16": 16, "F16": 16, "BF16": 16,
              "I32": 32, "U32": 32, "F32": 32, "C64": 64, "F64": 64, "I64": 64, "U64": 64}


SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"  # a sharded model's: {"weight_map": {tensor: shard file name}}


class HeaderError(ValueError):
    """What is wrong with a file that should be safetensors; the caller adds the file's name."""


class WeightFilesError(ValueError):
    """Why a model dir's safetensors weights cannot be found; the message names the file or dir, the caller adds
    the option that gave the dir."""


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of a Hugging Face model dir, as transformers loads them: the shards its index names
    (each present), else model.safetensors. A WeightFilesError for an index that is not one, a shard it names that
    is not there, or a dir with neither (pickle files are never loaded: they can run code)."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            shards = sorted(set(weight_map.values()))
            if not all(isinstance(s, str) and s and Path(s).name == s for s in shards):
                raise ValueError("a shard is not a file name in the dir")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise WeightFilesError(f"{index}: not a safetensors index ({e!r})") from None
        missing = [s for s in shards if not (directory / s).is_file()]
        if missing:
            raise WeightFilesError(f"{index} names shards that are not there: {', '.join(missing)}")
        if not shards:
            raise WeightFilesError(f"{index}: not a safetensors index (its weight_map names no file)")
        return [directory / s for s in shards]
    if (directory / SINGLE).is_file():
        return [directory / SINGLE]
    pickles = sorted(p.name for p in directory.glob("*.bin")) + sorted(p.name for p in directory.glob("*.pt*"))
    hint = (f" (found {', '.join(pickles)}: pickle files are never loaded, convert them to safetensors)"
            if pickles else "")
    raise WeightFilesError(f"{directory}: no safetensors weights ({SINGLE} or {INDEX}){hint}")


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
        tensors = {name: spec(name, t, base) for name, t in header.items() if name != "__metadata__"}
    except (AttributeError, KeyError, TypeError, IndexError) as e:
        raise HeaderError(f"not a safetensors file (its header does not list dtype, shape and offsets: "
                          f"{e!r})") from None
    check_layout(tensors, base, size)
    return tensors


def spec(name: str, entry: dict, base: int) -> TensorSpec:
    """One header entry as a TensorSpec; HeaderError for a dtype, shape or offsets safetensors would not parse."""
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise HeaderError(f"not a safetensors file (tensor {name!r}: unknown dtype {dtype!r})")
    for what, numbers in (("shape", shape), ("data offsets", offsets)):
        if not (isinstance(numbers, list) and all(type(n) is int and n >= 0 for n in numbers)):
            raise HeaderError(f"not a safetensors file (tensor {name!r}: its {what} {numbers!r} are not "
                              f"non-negative integers)")
    if len(offsets) != 2:
        raise HeaderError(f"not a safetensors file (tensor {name!r}: its data offsets {offsets!r} are not [start, "
                          f"end])")
    return TensorSpec(dtype, tuple(shape), base + offsets[0], base + offsets[1])


def check_layout(tensors: dict[str, TensorSpec], base: int, size: int) -> None:
    """The tensors' byte ranges as safetensors requires them (it refuses any other file): in offset order, each
    starting where the one before ends (the first at the data's start), each dtype x shape bytes long, and the
    last ending at the file's end."""
    ordered = sorted(tensors.items(), key=lambda item: (item[1].start, item[1].end))
    at = base
    for name, t in ordered:
        if t.start != at or t.end < t.start:
            where = ("end before they start" if t.end < t.start else
                     "overlap the tensor before it" if t.start < at else "leave a gap")
            raise HeaderError(f"not a safetensors file (tensor {name!r}: its data offsets "
                              f"[{t.start - base}, {t.end - base}] {where}; each tensor's data must follow the "
                              f"one before it, from offset 0)")
        elements, bits = math.prod(t.shape), DTYPE_BITS[t.dtype]
        if elements * bits != 8 * (t.end - t.start):
            raise HeaderError(f"not a safetensors file (tensor {name!r}: its data offsets give {t.end - t.start:,} "
                              f"bytes, its {t.dtype} shape {list(t.shape)} needs {elements * bits / 8:,g})")
        at = t.end
    if at > size:
        raise HeaderError(f"truncated: its header needs {at:,} bytes, the file has {size:,}")
    if at < size:
        raise HeaderError(f"not a safetensors file ({size - at:,} bytes after the data its header describes)")
