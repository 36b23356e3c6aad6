"""`eagle3 check DATA_DIR [--quick] [--total-seq-len N] [--aux-layer-ids ID ...]`: check a speculators-format
dataset before it costs a GPU day (eagle3/data/check.py says what each check reads). Exit status 1 when a row is
bad, or when the dataset lacks the verifier layers --aux-layer-ids names."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle3.cli.fields import add_fields, checked
from eagle3.cli.tail import finish
from eagle3.config import DataConfig, check_total_seq_len
from eagle3.errors import ConfigError, DataError

FLAGS = {"total_seq_len": "--total-seq-len"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="eagle3 check",
                                     description="Checking a speculators-format dataset before it costs a GPU day.")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--quick", action="store_true", help="skip the NaN/inf scan (reads headers and token ids only)")
    parser.add_argument("--vocab-size", type=int, help="the verifier's vocabulary size (default: from the record)")
    parser.add_argument("--aux-layer-ids", type=int, nargs="+", metavar="ID",
                        help="the verifier layers the draft reads (model.draft.aux_layer_ids; a DFlash draft's "
                             "target layers): refuse a dataset that does not hold exactly these")
    add_fields(parser, DataConfig, FLAGS, "data", defaults={"total_seq_len": None},
               helps={"total_seq_len": "also count the rows the trainer would cut to the run's total_seq_len"})
    args = parser.parse_args(argv)
    if args.vocab_size is not None and args.vocab_size < 1:
        parser.error(f"--vocab-size must be >= 1, got {args.vocab_size}")
    if args.total_seq_len is not None:
        try:
            checked(args, DataConfig, FLAGS, "data", lambda data: check_total_seq_len(data.total_seq_len))
        except ConfigError as e:
            parser.error(str(e))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def check() -> int:
        from eagle3.data.check import check_dataset, missing_aux_layers
        from eagle3.data.record import read_record

        if args.aux_layer_ids is not None and (problem := missing_aux_layers(args.data_dir, args.aux_layer_ids)):
            raise DataError(problem)
        vocab = args.vocab_size or ((read_record(args.data_dir) or {}).get("verifier") or {}).get("vocab_size")
        report = check_dataset(args.data_dir, vocab_size=vocab, full=not args.quick, progress=True,
                               total_seq_len=args.total_seq_len)
        truncation = report.truncation_warning()
        print(report.summary(first=10))
        if truncation:
            print(f"warning: {truncation}", file=sys.stderr)
        return 1 if report.bad else 0

    return finish(check)
