"""Checking a speculators-format dataset before it costs a GPU day.

    python -m eagle3.data.check <data_dir> [--quick]

Every row must have its `hidden_states/hs_<i>.safetensors`, with `hidden_states` of shape [seq_len, n_aux + 1,
hidden] and `token_ids` equal to the row's `input_ids`; the token ids must lie in the vocabulary and the loss
mask must not be empty. These need only the Arrow columns and each file's header and token ids, so the
trainer runs them at start-up (`quick`). The full check also reads every hidden state for NaN and inf.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from eagle3.errors import DataError, UserError
from eagle3.data.hsfiles import Problem, TensorSpec, file_problem, hs_path, read_header
from eagle3.data.rows import ArrowRows



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


def check_dataset(data_dir: str | Path, num_slots: int | None = None, hidden_size: int | None = None,
                  vocab_size: int | None = None, dtype: str | None = None, full: bool = False,
                  progress: bool = False) -> CheckReport:
    """Checks every row of `data_dir`; sizes left None are taken from the record or the first file."""
    from eagle3.data.record import read_record

    data_dir = Path(data_dir)
    try:
        rows = ArrowRows(data_dir)
    except Exception as e:  # noqa: BLE001  (datasets raises several types for a dir it cannot read)
        raise DataError(f"{data_dir} is not a dataset saved with datasets.save_to_disk ({e})") from None
    record = read_record(data_dir) or {}
    hidden_size = hidden_size or record.get("hidden_size")
    if num_slots is None and "aux_layer_ids" in record:
        num_slots = len(record["aux_layer_ids"]) + 1
    report = CheckReport(str(data_dir), len(rows), full=full)
    for i in tqdm(range(report.rows), desc="checking rows", unit="row", leave=False, mininterval=1.0,
                  disable=not (progress or report.rows >= 5000)):
        ids = rows.input_ids(i)
        problem = _row_problem(ids, rows.loss_mask(i), int(rows.seq_len[i]), vocab_size)
        problem = problem or hidden_state_problem(hs_path(data_dir, i), ids, num_slots, hidden_size, dtype, full)
        if problem:
            report.bad[i] = problem
    return report


def _row_problem(ids: np.ndarray, mask: np.ndarray, seq_len: int, vocab_size: int | None) -> Problem | None:
    if not len(ids) == len(mask) == seq_len:
        return Problem("malformed", f"input_ids {len(ids)}, loss_mask {len(mask)} and seq_len {seq_len} disagree")
    if vocab_size is not None and len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][0]
        return Problem("token_out_of_vocab", f"token id {bad} is outside the vocabulary of {vocab_size}")
    if not mask.any():
        return Problem("empty_loss_mask", "no token to train on (loss_mask is all 0)")
    return None


# NaN and inf are the values whose exponent bits are all ones: tested on the raw bits, nothing is converted.
EXPONENT_BITS = {"BF16": (np.uint16, 0x7F80), "F16": (np.uint16, 0x7C00), "F32": (np.uint32, 0x7F800000)}


def _finite(fd: int, spec: TensorSpec) -> bool:
    bits, exponent = EXPONENT_BITS[spec.dtype]
    raw = np.frombuffer(os.pread(fd, spec.end - spec.start, spec.start), bits)
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
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(report.summary(first=10))
    return 1 if report.bad else 0


if __name__ == "__main__":
    sys.exit(main())
