"""Reading draft checkpoints from disk: safetensors only (a pickle is never opened), single or sharded.

Headers are read without torch, so a bad file is reported before anything is built: not safetensors,
truncated, or missing from a shard index.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from eagle3.config import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint the user pointed at cannot be used as it is; the message names the file and the problem."""


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint dir: model.safetensors, or the shards its index names."""
    if not path.is_dir():
        raise CheckpointError(f"init.path: {path} does not exist or is not a directory; expected a draft "
                              "checkpoint dir with config.json and model.safetensors (or a sharded index)")
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: not a safetensors index ({e})") from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise CheckpointError(f"{index} names shards that are not there: {', '.join(missing)}")
        return [path / s for s in shards]
    single = path / "model.safetensors"
    if single.is_file():
        return [single]
    pickles = sorted(p.name for p in path.glob("*.bin")) + sorted(p.name for p in path.glob("*.pt*"))
    hint = f" (found {', '.join(pickles)}: pickle files are never loaded, convert them to safetensors)" if pickles else ""
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json{hint}")


def read_header(file: Path) -> dict[str, dict[str, Any]]:
    """{key: {"dtype", "shape", "data_offsets"}} of one safetensors file, checked against its size."""
    size = file.stat().st_size
    with open(file, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{file}: not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(size - 8, 100_000_000):
            raise CheckpointError(f"{file}: not a safetensors file (its first 8 bytes do not give a header length)")
        try:
            header = json.loads(f.read(header_len))
        except (UnicodeDecodeError, ValueError):
            raise CheckpointError(f"{file}: not a safetensors file (its header is not JSON)") from None
    header.pop("__metadata__", None)
    end = max((t["data_offsets"][1] for t in header.values()), default=0)
    if 8 + header_len + end > size:
        raise CheckpointError(f"{file}: truncated: its header needs {8 + header_len + end:,} bytes, the file has "
                              f"{size:,}")
    return header


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        for key, info in read_header(file).items():
            shapes[key] = tuple(info["shape"])
    return shapes


def load_tensors(files: list[Path], keys: set[str] | None = None) -> dict[str, Any]:
    from safetensors import safe_open

    out = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for key in f.keys():
                if keys is None or key in keys:
                    out[key] = f.get_tensor(key)
    return out


def read_config(path: Path) -> dict[str, Any]:
    file = path / "config.json"
    if not file.is_file():
        raise CheckpointError(f"{path}: no config.json")
    try:
        return json.loads(file.read_text())
    except ValueError as e:
        raise CheckpointError(f"{file}: not JSON ({e})") from None
