"""Checking a speculators-format dataset before it costs a GPU day.

    eagle3 check <data_dir> [--quick] [--total-seq-len N]

Every row must have its `hidden_states/hs_<i>.safetensors`, with `hidden_states` of shape [seq_len, n_aux + 1,
hidden] and `token_ids` equal to the row's `input_ids`; the token ids must lie in the vocabulary and the loss
mask must not be empty. These need only the Arrow columns and each file's header and token ids, so the
trainer runs them at start-up (`quick`). The full check also reads every hidden state for NaN and inf.

Given the run's `data.total_seq_len`, the check also counts the rows a micro-batch cannot hold whole: the
trainer cuts them to `total_seq_len` tokens. A few are a warning; more than TRUNCATION_ERROR_SHARE of the
rows stop the run, since then most of what was prepared is never trained on.
"""

from __future__ import annotations

import shlex
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from eagle3.errors import ConfigError, DataError
from eagle3.formats.arrow_rows import ArrowRows
from eagle3.formats.hidden_states import Problem, hidden_state_problem, hs_path

# Above this share of rows cut by data.total_seq_len, the start-up check stops the run instead of warning:
# a long-tail row or two is normal, a tenth of the data losing its end is a config mistake.
TRUNCATION_ERROR_SHARE = 0.10


@dataclass
class Truncation:
    """Rows longer than one micro-batch (`data.total_seq_len`), which the trainer cuts to fit."""

    total_seq_len: int
    rows: int = 0                 # rows cut
    tokens_lost: int = 0          # their tokens past the cut
    longest: int = 0              # the longest row's seq_len

    def as_dict(self) -> dict[str, int]:
        return {"total_seq_len": self.total_seq_len, "rows": self.rows, "tokens_lost": self.tokens_lost,
                "longest_row": self.longest}


@dataclass
class CheckReport:
    data_dir: str
    rows: int
    bad: dict[int, tuple[str, str]] = field(default_factory=dict)  # row -> (kind, detail)
    full: bool = False
    truncation: Truncation | None = None  # with the run's total_seq_len: the rows it cuts
    token_rows: bool = False  # hidden states were asked for and the dir has none: token rows, checked as such
    unfinished: str = ""  # its preparation did not finish: what to do (the missing files are its bad rows)

    @property
    def good_rows(self) -> list[int]:
        return [i for i in range(self.rows) if i not in self.bad]

    def counts(self) -> dict[str, int]:
        return dict(Counter(kind for kind, _ in self.bad.values()))

    def summary(self, first: int = 5) -> str:
        what = "token ids and loss masks" if self.token_rows else \
            "full check" if self.full else "quick check (no NaN/inf scan)"
        token_rows = ""
        if self.token_rows:
            token_rows = (f"{self.data_dir} is a token-row dataset: Arrow rows without hidden states, by design (what "
                          f"data=online and data=regenerate train on, the verifier computing the hidden states in "
                          f"the loop). Train on it with data=online data.path={self.data_dir}; data=offline needs "
                          f"hidden_states/hs_<i>.safetensors, which eagle3 prepare writes.\n")
        if self.unfinished:
            token_rows = f"{self.unfinished}\n"
        if not self.bad:
            return f"{token_rows}{self.data_dir}: {self.rows} rows, all good ({what})"
        lines = [f"{token_rows}{self.data_dir}: {len(self.bad)} of {self.rows} rows are bad ({what}): "
                 + ", ".join(f"{kind} {n}" for kind, n in sorted(self.counts().items()))]
        lines += [f"  row {i}: {detail}" for i, (_, detail) in sorted(self.bad.items())[:first]]
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        out = {"data_dir": self.data_dir, "rows": self.rows, "bad": len(self.bad), "counts": self.counts(),
               "full": self.full, "first_bad": [{"row": i, "kind": k, "detail": d}
                                                for i, (k, d) in sorted(self.bad.items())[:20]]}
        if self.truncation is not None:
            out["truncated"] = self.truncation.as_dict()
        return out

    def truncation_warning(self) -> str | None:
        """None when every row fits a micro-batch; a warning when a few do not; raises ConfigError when more
        than TRUNCATION_ERROR_SHARE of the rows would be cut."""
        cut = self.truncation
        if cut is None or not cut.rows:
            return None
        text = (f"{self.data_dir}: {cut.rows} of {self.rows} rows are longer than data.total_seq_len="
                f"{cut.total_seq_len} and are cut to it, losing {cut.tokens_lost} tokens (longest row: {cut.longest} "
                f"tokens). Set data.total_seq_len={cut.longest - 1} or more to train on them whole, or prepare "
                f"the data with --max-len {cut.total_seq_len + 1}")
        if cut.rows > TRUNCATION_ERROR_SHARE * self.rows:
            raise ConfigError(f"{text}. More than {TRUNCATION_ERROR_SHARE:.0%} of the rows: stopping.")
        return text


def check_dataset(data_dir: str | Path, num_slots: int | None = None, hidden_size: int | None = None,
                  vocab_size: int | None = None, dtype: str | None = None, full: bool = False,
                  progress: bool = False, total_seq_len: int | None = None, hidden_states: bool = True,
                  max_positions: int | None = None) -> CheckReport:
    """Checks every row of `data_dir`; sizes left None are taken from the record or the first file. With
    `total_seq_len` (tokens per micro-batch), also counts the rows the trainer would cut to it.
    `hidden_states=False` (data=online: the verifier computes them) checks the token rows alone, as it does for a
    dir without hidden_states/ (a token-row dataset: the report says so), and `max_positions` (the verifier's)
    makes a longer row a bad one. token_freq.pt is read by the reader training uses (eagle3.formats.vocab): a file
    training would refuse is refused here."""
    from eagle3.data.record import read_record
    from eagle3.formats.vocab import read_token_freq

    data_dir = Path(data_dir)
    record = (read_record(data_dir) if data_dir.is_dir() else None) or {}
    try:
        rows = ArrowRows(data_dir)
    except Exception as e:  # noqa: BLE001  (datasets raises several types for a dir it cannot read)
        raise not_a_dataset(data_dir, record, e) from None
    hidden_size = hidden_size or record.get("hidden_size")
    if num_slots is None and "aux_layer_ids" in record:
        num_slots = len(record["aux_layer_ids"]) + 1
    token_rows = hidden_states and not (data_dir / "hidden_states").is_dir()
    hidden_states = hidden_states and not token_rows
    try:
        read_token_freq(data_dir)  # its ids against the vocabulary: the rows' check below
    except DataError:
        if record.get("complete") is False:  # stopped before it was written
            raise DataError(unfinished(data_dir, record)) from None
        raise
    report = CheckReport(str(data_dir), len(rows), full=full and hidden_states, token_rows=token_rows,
                         unfinished=unfinished(data_dir, record) if record.get("complete") is False else "")
    if total_seq_len is not None:
        report.truncation = count_truncated(np.asarray(rows.seq_len, dtype=np.int64), total_seq_len)
    for i in tqdm(range(report.rows), desc="checking rows", unit="row", leave=False, mininterval=1.0,
                  disable=not (progress or report.rows >= 5000)):
        ids = rows.input_ids(i)
        problem = _row_problem(ids, rows.loss_mask(i), int(rows.seq_len[i]), vocab_size)
        if problem is None and max_positions is not None and len(ids) > max_positions:
            problem = Problem("too_long", f"{len(ids)} tokens, beyond the verifier's {max_positions} positions "
                                          f"(max_position_embeddings)")
        if problem is None and hidden_states:
            problem = hidden_state_problem(hs_path(data_dir, i), ids, num_slots, hidden_size, dtype, full)
        if problem:
            report.bad[i] = problem
    return report


def unfinished(data_dir: Path, record: dict[str, Any]) -> str:
    """What a dataset whose preparation did not finish says: the same prepare command resumes it."""
    source = f"--data {shlex.quote(record['source'])} " if isinstance(record.get("source"), str) else ""
    return (f"{data_dir}: its preparation did not finish (eagle3_data.json says complete: false): run the same "
            f"eagle3 prepare command again ({source}--out {shlex.quote(str(data_dir))}), it resumes "
            f"where it stopped")


def not_a_dataset(data_dir: Path, record: dict[str, Any], error: Exception) -> DataError:
    """Why `data_dir` cannot be read as a speculators-format dataset: a preparation stopped before its rows were
    written, rows that prepare (or data=online) reads (a rows file, a datasets dir of conversations or of token
    rows without seq_len), or no dataset at all (`error`: the reader's)."""
    from eagle3.config import rows_path_problem
    from eagle3.formats.row_files import dataset_table

    if record.get("complete") is False:
        return DataError(unfinished(data_dir, record))
    columns: list[str] = []
    if data_dir.is_dir() and rows_path_problem(data_dir) is None:
        try:
            columns = dataset_table(data_dir).column_names
        except DataError:
            pass
    rows = (data_dir.is_file() and rows_path_problem(data_dir) is None) or bool(
        {"input_ids", "messages", "conversations"} & set(columns))
    if not rows:
        return DataError(f"{data_dir} is not a dataset saved with datasets.save_to_disk ({error})")
    what = f"a datasets dir of rows (columns {', '.join(columns)})" if columns else "a rows file"
    path = shlex.quote(str(data_dir))
    return DataError(f"{data_dir} is {what}, not a prepared dataset (Arrow rows with seq_len and their hidden "
                     f"states): prepare it with eagle3 prepare --model <verifier> --data {path} --out "
                     f"<dir> (for data=offline), or train on it as it is with data=online data.path={path}")


def missing_aux_layers(data_dir: str | Path, wanted: list[int]) -> str | None:
    """Why the dataset cannot feed a draft reading the verifier's layers `wanted` (a DFlash draft asks for more
    than EAGLE-3's three), or None: its record (eagle3_data.json) names the layers its hidden states hold."""
    from eagle3.data.record import read_record

    held = (read_record(Path(data_dir)) or {}).get("aux_layer_ids")
    if held is None:
        return f"{data_dir} has no record of its aux layers (eagle3_data.json): prepare it with eagle3 prepare"
    missing = [i for i in wanted if i not in held]
    if list(held) == list(wanted):
        return None
    what = f"lacks layers {missing}" if missing else "holds them in another order or with others"
    return (f"{data_dir} holds the hidden states of layers {list(held)} (Hugging Face output_hidden_states "
            f"indexing), the draft asks for {list(wanted)}: it {what}; prepare it again with "
            f"--aux-layer-ids {' '.join(map(str, wanted))}, or train with data=online")


def count_truncated(seq_lens: np.ndarray, total_seq_len: int) -> Truncation:
    # A row of L tokens trains on L - 1 positions (inputs shifted by one against their targets); a micro-batch
    # holds total_seq_len of them, so rows with L - 1 > total_seq_len are cut.
    positions = seq_lens - 1
    over = positions > total_seq_len
    return Truncation(total_seq_len, int(over.sum()), int((positions[over] - total_seq_len).sum()),
                      int(seq_lens.max(initial=0)))


def _row_problem(ids: np.ndarray, mask: np.ndarray, seq_len: int, vocab_size: int | None) -> Problem | None:
    if not len(ids) == len(mask) == seq_len:
        return Problem("malformed", f"input_ids {len(ids)}, loss_mask {len(mask)} and seq_len {seq_len} disagree")
    if vocab_size is not None and len(ids) and (ids.min() < 0 or ids.max() >= vocab_size):
        bad = ids[(ids < 0) | (ids >= vocab_size)][0]
        return Problem("token_out_of_vocab", f"token id {bad} is outside the vocabulary of {vocab_size}")
    if ((mask != 0) & (mask != 1)).any():
        return Problem("bad_loss_mask", f"loss_mask holds {mask[(mask != 0) & (mask != 1)][0]}; its values are 1 "
                                        f"(trained) and 0 (not trained)")
    if not mask.any():
        return Problem("empty_loss_mask", "no token to train on (loss_mask is all 0)")
    return None


if __name__ == "__main__":  # the older path of `eagle3 check` (eagle3/cli/check.py)
    import runpy

    sys.argv[0:1] = ["eagle3", "check"]
    runpy.run_module("eagle3.cli", run_name="__main__")
