"""Regeneration's tokens/s: transformers' generate in process against vLLM's server, side by side on one verifier.

    python bench/regenerate.py --verifier <HF model dir> --prompts <JSONL of {"messages"} rows> [--n 8]
        [--max-new-tokens 64] [--reps 3]

Both engines answer the same prompts (the first `--n` of the file, as data=regenerate reads them) at temperature 0
with the same budget, in one batch each, through eagle3.data.regenerate's own batch generators (`generate`, and
regenerate_vllm's `served`, the server started once and kept up). The reps alternate between the engines, so a
change in the machine's load falls on both; the ratio printed is the median over reps of vLLM's tokens/s over
transformers' within a rep. The server's start-up is timed apart (a fixed cost per regeneration).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import common  # noqa: F401  (the repository on sys.path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--verifier", required=True, type=Path)
    parser.add_argument("--prompts", required=True, type=Path)
    parser.add_argument("--n", type=int, default=8, help="prompts, answered in one batch")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()

    import torch

    from eagle3.config import Regeneration, RegenerationEngine
    from eagle3.data.regenerate import generate, read_prompts
    from eagle3.data.regenerate_vllm import served
    from eagle3.formats.row_formats import BadSamples
    from eagle3.verifier.model import Verifier

    verifier = Verifier(args.verifier)
    vocab = verifier.config["vocab_size"]
    prompts = read_prompts(args.prompts, args.verifier, vocab, BadSamples("skip"))[: args.n]
    budgets = [args.max_new_tokens] * len(prompts)
    settings = Regeneration(max_new_tokens=args.max_new_tokens, batch_size=len(prompts),
                            engine=RegenerationEngine.transformers)
    model = verifier.load("cpu", torch.float32)
    in_process = partial(generate, model, verifier.eos_ids(), settings)
    log = Path(tempfile.mkdtemp(prefix="eagle3-regen-bench-")) / "vllm.log"
    start = time.perf_counter()
    with served(args.verifier, settings, log) as by_vllm:
        startup = time.perf_counter() - start
        rates: dict[str, list[float]] = {"transformers": [], "vllm": []}
        for rep in range(args.reps + 1):
            order = [("transformers", in_process), ("vllm", by_vllm)]
            for name, batches in order if rep % 2 == 0 else order[::-1]:
                t0 = time.perf_counter()
                out = batches(prompts, budgets, 0)
                took = time.perf_counter() - t0
                if rep:  # the first rep warms both up
                    rates[name].append(sum(len(g.ids) for g in out) / took)
    ratios = [v / t for v, t in zip(rates["vllm"], rates["transformers"])]
    print(f"{len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), up to "
          f"{args.max_new_tokens} new tokens each, temperature 0, torch threads {torch.get_num_threads()}")
    for name, values in rates.items():
        print(f"{name:<13} {statistics.median(values):8.1f} tokens/s (reps: {', '.join(f'{v:.1f}' for v in values)})")
    print(f"vllm / transformers: {statistics.median(ratios):.2f} (median of per-rep ratios: "
          f"{', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"vLLM server start-up: {startup:.0f} s (once per regeneration; log: {log})")


if __name__ == "__main__":
    main()
