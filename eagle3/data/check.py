"""Checking a speculators-format dataset before it costs a GPU day.

    python -m eagle3.data.check <data_dir> [--quick]

Every row must have its `hidden_states/hs_<i>.safetensors`, with `hidden_states` of shape [seq_len, n_aux + 1,
hidden] and `token_ids` equal to the row's `input_ids`; the token ids must lie in the vocabulary and the loss
mask must not be empty. These need only the Arrow columns and each file's header and token ids, so the
trainer runs them at start-up (`quick`). The full check also reads every hidden state for NaN and inf.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from eagle3.config import ConfigError
from eagle3.init.files import read_header

SAFETENSORS_DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "I64": "int64"}
NUMPY_DTYPES = {"I64": np.int64, "I32": np.int32}


@dataclass
class CheckReport:
    data_dir: str
    rows: int
    bad: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, detail)
    full: bool = False

    @property
    def good_rows(self) -> list[int]:
        return [i for i in range(self.rows) if i not in self.bad]

    def counts(self) -> dict[str, int]:
        return dict(Counter(kind for kind, _ in self.bad.values()))

    def summary(self, first: int = 5) -> str:
        what = "full check" if self.full else "quick check (no NaN/inf scan)"
        if not self.bad:
            return f"{self.data_dir}: {self.rows} rows, all good ({what})"
        lines = [f"{self.data_dir}: {len(self.bad)} of {self.rows} rows are bad ({what}): "
                 + ", ".join(f"{kind} {n}" for kind, n in sorted(self.counts().items()))]
        lines += [f"  row {i}: {detail}" for i, (_, detail) in sorted(self.bad.items())[:first]]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        return {"data_dir": self.data_dir, "rows": self.rows, "bad": len(self.bad), "counts": self.counts(),
                "full": self.full, "first_bad": [{"row": i, "kind": k, "detail": d}
                                                 for i, (k, d) in sorted(self.bad.items())[:20]]}


def hidden_state_problem(file: Path, ids: np.ndarray, num_slots: int | None, hidden_size: int | None,
                         dtype: str | None = None, full: bool = False) -> tuple[str, str] | None:
    """(kind, detail) of what is wrong with one row's hidden-state file, or None when it is usable."""
    if not file.is_file():
        return "missing_file", f"{file.parent.name}/{file.name} is missing"
    try:
        header = read_header(file)
    except ConfigError as e:
        return "unreadable_file", str(e)
    hs, tok = header.get("hidden_states"), header.get("token_ids")
    if hs is None or tok is None:
        return "unreadable_file", f"{file.name} lacks hidden_states or token_ids"
    shape = tuple(hs["shape"])
    expected = (len(ids), num_slots or shape[1:2] and shape[1], hidden_size or shape[-1:] and shape[-1])
    if shape != expected:
        return "wrong_shape", (f"{file.name}: hidden_states {shape}, expected {expected} "
                               f"(seq_len, aux layers + 1, hidden size)")
    if dtype is not None and SAFETENSORS_DTYPES.get(hs["dtype"]) != dtype:
        return "wrong_dtype", f"{file.name}: hidden_states are {hs['dtype']}, expected {dtype}"
    token_ids = _read(file, tok)
    if token_ids.shape != ids.shape or not np.array_equal(token_ids, ids):
        if token_ids.shape != ids.shape:
            where = f"{token_ids.shape[0]} token ids for {len(ids)} input ids"
        else:
            where = f"first difference at position {int(np.argmax(token_ids != ids))}"
        return "token_mismatch", f"{file.name}: token_ids differ from the row's input_ids ({where})"
    if full and not _finite(file, hs):
        return "non_finite", f"{file.name}: hidden_states hold NaN or inf"
    return None


def check_dataset(data_dir: str | Path, num_slots: int | None = None, hidden_size: int | None = None,
                  vocab_size: int | None = None, dtype: str | None = None, full: bool = False,
                  progress: bool = False) -> CheckReport:
    """Checks every row of `data_dir`; sizes left None are taken from the record or the first file."""
    from datasets import load_from_disk

    from eagle3.data.record import read_record

    data_dir = Path(data_dir)
    try:
        table = load_from_disk(str(data_dir)).data
    except Exception as e:  # noqa: BLE001  (datasets raises several types for a dir it cannot read)
        raise ConfigError(f"{data_dir} is not a dataset saved with datasets.save_to_disk ({e})") from None
    record = read_record(data_dir) or {}
    hidden_size = hidden_size or record.get("hidden_size")
    if num_slots is None and "aux_layer_ids" in record:
        num_slots = len(record["aux_layer_ids"]) + 1
    ids_flat, ids_offsets = _flat(table.column("input_ids"))
    mask_flat, mask_offsets = _flat(table.column("loss_mask"))
    seq_len = np.asarray(table.column("seq_len").to_numpy(zero_copy_only=False))
    report = CheckReport(str(data_dir), len(seq_len), full=full)
    hs_dir = data_dir / "hidden_states"
    for i in tqdm(range(report.rows), desc="checking rows", unit="row", leave=False, mininterval=1.0,
                  disable=not (progress or report.rows >= 5000)):
        ids = ids_flat[ids_offsets[i]:ids_offsets[i + 1]]
        mask = mask_flat[mask_offsets[i]:mask_offsets[i + 1]]
        problem = _row_problem(ids, mask, int(seq_len[i]), vocab_size)
        problem = problem or hidden_state_problem(hs_dir / f"hs_{i}.safetensors", ids, num_slots, hidden_size,
                                                  dtype, full)
        if problem:
            report.bad[i] = problem
    return report


def _row_problem(ids: np.ndarray, mask: np.ndarray, seq_len: int, vocab_size: int | None) -> tuple[str, str] | None:
    if not len(ids) == len(mask) == seq_len:
        return "malformed", f"input_ids {len(ids)}, loss_mask {len(mask)} and seq_len {seq_len} disagree"
    if vocab_size is not None and len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][0]
        return "token_out_of_vocab", f"token id {bad} is outside the vocabulary of {vocab_size}"
    if not mask.any():
        return "empty_loss_mask", "no token to train on (loss_mask is all 0)"
    return None


def _flat(column) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values and row offsets, without a Python object per token."""
    import pyarrow as pa

    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    values = array.values.to_numpy(zero_copy_only=False)
    offsets = array.offsets.to_numpy()
    return values[offsets[0]:], offsets - offsets[0]


def _read(file: Path, info: dict[str, Any]) -> np.ndarray:
    start, end = info["data_offsets"]
    with open(file, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        f.seek(8 + header_len + start)
        raw = f.read(end - start)
    return np.frombuffer(raw, NUMPY_DTYPES[info["dtype"]])


# NaN and inf are the values whose exponent bits are all ones: tested on the raw bits, nothing is converted.
EXPONENT_BITS = {"BF16": (np.uint16, 0x7F80), "F16": (np.uint16, 0x7C00), "F32": (np.uint32, 0x7F800000)}


def _finite(file: Path, info: dict[str, Any]) -> bool:
    start, end = info["data_offsets"]
    bits, exponent = EXPONENT_BITS[info["dtype"]]
    with open(file, "rb") as f:
        header_len = int.from_bytes(f.read(8), "little")
        f.seek(8 + header_len + start)
        raw = np.frombuffer(f.read(end - start), bits)
    return not bool(((raw & exponent) == exponent).any())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3.data.check", description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--quick", action="store_true", help="skip the NaN/inf scan (reads headers and token ids only)")
    parser.add_argument("--vocab-size", type=int, help="the verifier's vocabulary size (default: from the record)")
    args = parser.parse_args(argv)
    from eagle3.data.record import read_record

    try:
        vocab = args.vocab_size or ((read_record(args.data_dir) or {}).get("verifier") or {}).get("vocab_size")
        report = check_dataset(args.data_dir, vocab_size=vocab, full=not args.quick, progress=True)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(report.summary(first=10))
    return 1 if report.bad else 0


if __name__ == "__main__":
    sys.exit(main())
