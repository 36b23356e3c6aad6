"""Reading draft checkpoints from disk: safetensors only (a pickle is never opened), single or sharded.

Headers are read without torch, so a bad file is reported before anything is built: not safetensors,
truncated, or missing from a shard index.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from eagle3.errors import CheckpointError
from eagle3.formats.tensorfile import HeaderError, TensorSpec, WeightFilesError, read_specs, weight_files


def checkpoint_files(path: Path, given_as: str) -> list[Path]:
    """The safetensors files of a checkpoint dir (eagle3.formats.tensorfile.weight_files) as CheckpointErrors.
    `given_as` names where the user gave `path` (init.path, a CLI's argument): a message names it, not another tool's
    key."""
    from eagle3.config import path_kind

    if not path.is_dir():
        raise CheckpointError(f"{given_as}: {path} {path_kind(path, 'a directory')}; expected a draft checkpoint "
                              "dir with config.json and model.safetensors (or a sharded index)")
    try:
        return weight_files(path)
    except WeightFilesError as e:
        raise CheckpointError(str(e)) from None


def read_header(file: Path) -> dict[str, TensorSpec]:
    """The tensors of one safetensors file, checked against its size."""
    fd = os.open(file, os.O_RDONLY)
    try:
        return read_specs(fd)
    except HeaderError as e:
        raise CheckpointError(f"{file}: {e}") from None
    finally:
        os.close(fd)


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    return {key: spec.shape for file in files for key, spec in read_header(file).items()}


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
