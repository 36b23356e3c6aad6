"""The ShareGPT slices of docs/real_model.sh and docs/learning_curve.sh, in ShareGPT's own format (JSON arrays of
{"id", "conversations"} records), read with the project's reader:

    python docs/sharegpt_split.py SHAREGPT OUT_DIR --train N [--regen-prompts M]

train.json: the first N conversations of the file's head half that hold at most 4,000 characters, from their first
human turn, every turn a known speaker's with text; regen_prompts.json (with --regen-prompts): the first human turns
of the first M of them; held_out.json: 64 first human turns of at most 2,000 characters from the file's last 2,000
records, never trained on.
"""

import argparse
import json
from pathlib import Path

from eagle3.formats.row_files import records
from eagle3.formats.row_formats import SHAREGPT_ROLES


def exchange(record, max_chars):
    """The record from its first human turn on, if every turn is a known speaker's with text and it is short."""
    turns = record.get("conversations") or []
    if not turns or any(t.get("from") not in SHAREGPT_ROLES or not (t.get("value") or "").strip() for t in turns):
        return None
    while turns and SHAREGPT_ROLES[turns[0]["from"]] != "user":
        turns = turns[1:]
    if len(turns) < 2 or sum(len(t["value"]) for t in turns) > max_chars:
        return None
    return {"id": record.get("id"), "conversations": turns}


def first_turn(record):
    return {**record, "conversations": record["conversations"][:1]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("sharegpt", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--train", type=int, required=True)
    p.add_argument("--regen-prompts", type=int)
    args = p.parse_args()
    # every complete record: the wheel's file is cut mid-record, and the cut is the one unreadable record after them
    rows = [r for _, r in records(args.sharegpt) if isinstance(r, dict)]
    head, tail = rows[:len(rows) // 2], rows[-2000:]
    train = [r for r in (exchange(r, 4000) for r in head) if r][:args.train]
    slices = {"train": train, "held_out": [first_turn(r) for r in (exchange(r, 2000) for r in tail) if r][:64]}
    if args.regen_prompts is not None:
        slices["regen_prompts"] = [first_turn(r) for r in train[:args.regen_prompts]]
    for name, slice_ in slices.items():
        (args.out / f"{name}.json").write_text(json.dumps(slice_, indent=1))
        print(f"{name}: {len(slice_)} conversations")


if __name__ == "__main__":
    main()
