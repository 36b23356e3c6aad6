"""How full the packed micro-batches are: speculators' packing against the project's (eagle3/formats/packing.py).

    python bench/packing.py                                  # chat-like lengths (400 rows, mean about 550 tokens)
    python bench/packing.py --reference 400                  # SmolLM2's tokens of the reference ShareGPT's first
                                                             # 400 conversations under 4,000 characters
    python bench/packing.py --data <dataset dir>             # a prepared dataset's train rows
    python bench/packing.py --total-seq-len 1024 2048 --replicas 1 2 8

The fill is tokens / (micro-batches x total_seq_len): the positions the rows take (n - 1 for n tokens, cut at
total_seq_len) over the positions of every micro-batch an epoch steps through, `replicas` (world size x grad_accum)
per step. speculators' MultipackDistributedBatchSamplerV2 packs each epoch anew, so its count is shown for epochs
0-3; its micro-batches per epoch are counted over all replicas, and the rows it drops (fewer left than replicas)
are named. No timing: the figures are counts.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import numpy as np
from common import ROOT  # noqa: F401  (puts this checkout's eagle3 first on the path)


def chat_like_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Token counts shaped as SmolLM2's tokens of ShareGPT conversations under 4,000 characters (mean about 550,
    median about 500, 5-6% over 1,024), as tests/formats/test_packing.py draws them."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.23, 0.45, n), 8, 2700).astype(np.int64)


def reference_lengths(n: int) -> np.ndarray:
    """SmolLM2's chat-template tokens of the reference ShareGPT file's first `n` conversations from a human turn
    with every turn's text under 4,000 characters in all (docs/real_model.sh's training slice)."""
    from eagle3.formats.row_files import records
    from eagle3.formats.row_formats import SHAREGPT_ROLES
    from eagle3.reference import reference_dir
    from eagle3.verifier.model import Verifier

    root = reference_dir()
    chat = Verifier(root / "SmolLM2-135M-Instruct").chat_tokenizer()
    out: list[int] = []
    for _, record in records(root / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json"):
        turns = record.get("conversations") or [] if isinstance(record, dict) else []
        if not turns or any(t.get("from") not in SHAREGPT_ROLES or not (t.get("value") or "").strip() for t in turns):
            continue
        while turns and SHAREGPT_ROLES[turns[0]["from"]] != "user":
            turns = turns[1:]
        if len(turns) < 2 or sum(len(t["value"]) for t in turns) > 4000:
            continue
        ids = chat.render([{"role": SHAREGPT_ROLES[t["from"]], "content": t["value"]} for t in turns], False)
        out.append(len(ids))
        if len(out) == n:
            break
    return np.asarray(out, dtype=np.int64)


def speculators_packing(lengths: np.ndarray, t: int, replicas: int, epochs: int = 4) -> tuple[list[int], list[float],
                                                                                              int]:
    """speculators' sampler per epoch over all replicas: micro-batches, their fill (the rows it packed), and the
    most rows an epoch drops."""
    from speculators.train.distributed_batch_sampler import MultipackDistributedBatchSamplerV2

    from eagle3.formats.packing import sizes

    row_sizes = sizes(lengths, t)
    counts, fills, dropped = [], [], 0
    for epoch in range(epochs):
        packs = []
        for rank in range(replicas):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sampler = MultipackDistributedBatchSamplerV2(t, lengths, num_replicas=replicas, rank=rank)
            sampler.set_epoch(epoch)
            packs += list(sampler)
        rows = [int(i) for p in packs for i in p]
        counts.append(len(packs))
        fills.append(int(row_sizes[rows].sum()) / (len(packs) * t))
        dropped = max(dropped, len(lengths) - len(rows))
    return counts, fills, dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--rows", type=int, default=400, help="chat-like rows drawn (the default source)")
    source.add_argument("--reference", type=int, metavar="N", help="the reference ShareGPT's first N conversations")
    source.add_argument("--data", type=Path, help="a prepared dataset dir: its train rows")
    parser.add_argument("--train-ratio", type=float, default=0.95, help="with --data: the train split's share")
    parser.add_argument("--total-seq-len", type=int, nargs="+", default=[1024, 2048, 3072])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2], help="world size x grad_accum")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    from eagle3.formats.packing import sizes, steps_per_epoch

    if args.reference:
        lengths, what = reference_lengths(args.reference), f"reference ShareGPT, first {args.reference} conversations"
    elif args.data:
        from eagle3.formats.arrow_rows import ArrowRows

        seq_len = ArrowRows(args.data).seq_len
        lengths, what = seq_len[:int(len(seq_len) * args.train_ratio)], f"train rows of {args.data}"
    else:
        lengths, what = chat_like_lengths(args.rows), f"{args.rows} chat-like rows"
    print(f"{what}: {len(lengths)} rows, {int(lengths.sum()):,} tokens, mean {lengths.mean():.0f}, "
          f"median {np.median(lengths):.0f}, max {lengths.max()}")
    results = []
    for t in args.total_seq_len:
        for replicas in args.replicas:
            positions = int(sizes(lengths, t).sum())
            ours = steps_per_epoch(lengths, t, replicas) * replicas
            theirs, fill_theirs, dropped = speculators_packing(lengths, t, replicas)
            result = {"total_seq_len": t, "replicas": replicas, "tokens": positions,
                      "speculators_micro_batches": theirs,
                      "speculators_fill": fill_theirs, "speculators_rows_dropped": dropped,
                      "eagle3_micro_batches": ours, "eagle3_fill": positions / (ours * t)}
            results.append(result)
            drop = f", up to {dropped} rows left out an epoch" if dropped else ""
            print(f"T={t:5d} replicas={replicas}: speculators {min(theirs)}-{max(theirs)} micro-batches an epoch, fill "
                  f"{min(fill_theirs):.3f}-{max(fill_theirs):.3f}{drop}; eagle3 {ours} every epoch, fill "
                  f"{result['eagle3_fill']:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"source": what, "rows": len(lengths), "results": results}, indent=1))


if __name__ == "__main__":
    main()
