"""speculators' hidden-state files, read without safetensors' mmap: the header, checks, reads into a buffer.

    hidden_states/hs_<row>.safetensors: hidden_states [seq_len, n_aux + 1, H] (float), token_ids [seq_len] (int)

Headers are parsed by eagle3/formats/tensorfile.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from eagle3.errors import DataError
from eagle3.formats.tensorfile import HeaderError, TensorSpec, read_specs

FLOAT_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
DTYPE_NAMES = {v: k for k, v in FLOAT_DTYPES.items()}
INT_DTYPES = {"I64": np.int64, "I32": np.int32}


def hs_path(data_dir: Path, row: int) -> Path:
    return Path(data_dir) / "hidden_states" / f"hs_{row}.safetensors"


def open_file(path: Path, row: int) -> int:
    try:
        return os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise DataError(f"{path}: missing (the hidden states of row {row}); the data changed after the run's "
                        f"start-up check, or that check did not run") from None


def read_header(fd: int, path: Path) -> dict[str, TensorSpec]:
    """The tensors a hidden-state file holds, with their absolute byte ranges."""
    try:
        return read_specs(fd)
    except HeaderError as e:
        raise DataError(f"{path.name}: {e}") from None


class Problem(NamedTuple):
    kind: str    # missing_file, unreadable_file, wrong_shape, token_mismatch, non_finite, ...
    detail: str  # starts with the file's name


def file_problem(fd: int, path: Path, ids: np.ndarray, num_slots: int | None, hidden_size: int | None,
                 dtype: str | None = None) -> Problem | None:
    """What is wrong with a row's hidden-state file against its input_ids and the expected shape and dtype (None:
    any); reads the header and the token ids (16 KB at 2048 tokens), not the hidden states."""
    try:
        tensors = read_header(fd, path)
    except DataError as e:
        return Problem("unreadable_file", str(e))
    return tensors_problem(fd, path, tensors, ids, num_slots, hidden_size, dtype)


def tensors_problem(fd: int, path: Path, tensors: dict[str, TensorSpec], ids: np.ndarray, num_slots: int | None,
                    hidden_size: int | None, dtype: str | None) -> Problem | None:
    """file_problem for a header already read."""
    hs, tok = tensors.get("hidden_states"), tensors.get("token_ids")
    if hs is None or tok is None:
        return Problem("unreadable_file", f"{path.name}: expected tensors hidden_states and token_ids, found "
                                          f"{sorted(tensors)}")
    want = [len(ids), num_slots or (hs.shape[1:2] or (0,))[0], hidden_size or (hs.shape[-1:] or (0,))[0]]
    if list(hs.shape) != want or hs.dtype not in FLOAT_DTYPES or dtype not in (None, hs.dtype):
        return Problem("wrong_shape", f"{path.name}: hidden_states is {hs.dtype} {list(hs.shape)}, expected "
                                      f"{dtype or 'floats'} {want} (the row's tokens, aux layers + the last, "
                                      f"hidden size)")
    if tok.dtype not in INT_DTYPES or tok.shape != (len(ids),):
        return Problem("token_mismatch", f"{path.name}: token_ids is {tok.dtype} {list(tok.shape)}, expected "
                                         f"[{len(ids)}] integers")
    token_ids = np.frombuffer(os.pread(fd, tok.end - tok.start, tok.start), INT_DTYPES[tok.dtype])
    if not np.array_equal(token_ids, ids):
        first = int(np.argmax(token_ids != ids))
        return Problem("token_mismatch", f"{path.name}: token_ids differ from the row's input_ids (first difference "
                                         f"at position {first})")
    return None


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
    """Raises DataError if the file does not fit its row and the draft's shape; returns where its hidden states
    start. The start-up check (eagle3.data.check) ran the same test, so a failure means the data changed."""
    try:
        tensors = read_header(fd, path)
        problem = tensors_problem(fd, path, tensors, ids, num_aux + 1, hidden_size, DTYPE_NAMES[dtype])
    except DataError as e:
        problem = Problem("unreadable_file", str(e))
    if problem is not None:
        raise DataError(f"{path.parent}/{problem.detail} (row {row}; the data changed after the run's start-up "
                        f"check, or that check did not run)")
    return tensors["hidden_states"].start


def read_into(fd: int, dest: memoryview, offset: int, path: Path) -> None:
    """Fills `dest` from the file at `offset` (preadv releases the GIL); a short file is an error."""
    done = 0
    while done < len(dest):
        n = os.preadv(fd, [dest[done:]], offset + done)
        if n == 0:
            raise DataError(f"{path}: truncated ({offset + done} bytes, the header promises more)")
        done += n


def hidden_state_problem(file: Path, ids: np.ndarray, num_slots: int | None, hidden_size: int | None,
                         dtype: str | None = None, full: bool = False) -> Problem | None:
    """What is wrong with one row's hidden-state file, or None when it is usable (`full`: NaN/inf scan too)."""
    try:
        fd = os.open(file, os.O_RDONLY)
    except FileNotFoundError:
        return Problem("missing_file", f"{file.parent.name}/{file.name} is missing")
    try:
        problem = file_problem(fd, file, ids, num_slots, hidden_size, dtype)
        if problem is None and full and not _finite(fd, read_header(fd, file)["hidden_states"]):
            problem = Problem("non_finite", f"{file.name}: hidden_states hold NaN or inf")
        return problem
    finally:
        os.close(fd)


EXPONENT_BITS = {"BF16": (np.uint16, 0x7F80), "F16": (np.uint16, 0x7C00), "F32": (np.uint32, 0x7F800000)}


def _finite(fd: int, spec: TensorSpec) -> bool:
    bits, exponent = EXPONENT_BITS[spec.dtype]
    raw = np.frombuffer(os.pread(fd, spec.end - spec.start, spec.start), bits)
    return not bool(((raw & exponent) == exponent).any())
