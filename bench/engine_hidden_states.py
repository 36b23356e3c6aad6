"""Hidden-state extraction by the serving engine (prepare --engine vllm) against the transformers path
(--engine transformers) on the same rows, side by side: tokens/s of each, their ratio, and the engine's start.

    python bench/engine_hidden_states.py                        # the tiny verifier, and SmolLM2 when built
    python bench/engine_hidden_states.py --model DIR --rows 256 --min-len 128 --max-len 1024 --json out.json

Rows are random token ids (the verifier's vocabulary), fp32 on a CPU (the engine's CPU build computes in fp32 as the
transformers path does there), aux ids [2, N//2, N-3] (the tiny verifier's 4 layers: [1, 2, 3]), both writing
speculators' files with the same batch plan (--batch-tokens). Extraction time leaves each side's start out (the
engine's start, printed apart, is a fixed cost per preparation); both run with --threads threads. The largest
relative difference between the two sides' states is printed too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the repository on sys.path)


def reference_smollm2() -> Path:
    """Where `python -m eagle3.reference --install` builds SmolLM2-135M-Instruct."""
    cache = os.environ.get("EAGLE3_CACHE") or str(Path.home() / ".cache" / "eagle3")
    return Path(cache) / "reference" / "SmolLM2-135M-Instruct"


def token_rows(n: int, vocab: int, shortest: int, longest: int) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        length = rng.randint(shortest, longest)
        rows.append(([rng.randrange(vocab) for _ in range(length)], [0] + [1] * (length - 1)))
    return rows


def measure(model_dir: Path, args: argparse.Namespace) -> dict:
    import torch

    from eagle3.data import vllm_hidden_states as vllm
    from eagle3.engine.venv import engine_python
    from eagle3.verifier.forward import write_hidden_states
    from eagle3.verifier.model import Verifier
    from eagle3.verifier.shape import default_aux_layer_ids

    verifier = Verifier(model_dir).fingerprint()
    layers = verifier["num_hidden_layers"]
    aux = default_aux_layer_ids(layers) if layers > 5 else [1, 2, 3]
    rows = token_rows(args.rows, verifier["vocab_size"], args.min_len, args.max_len)
    tokens = sum(len(ids) for ids, _ in rows)
    with tempfile.TemporaryDirectory(prefix="bench-hs-") as tmp:
        start = time.perf_counter()
        model = Verifier(model_dir).load()
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        write_hidden_states(model, rows, Path(tmp) / "transformers", aux, args.batch_tokens, torch.float32)
        transformers_s = time.perf_counter() - start
        del model
        config = json.loads((model_dir / "config.json").read_text())
        timings: dict[str, float] = {}
        vllm.write_hidden_states(engine_python(), model_dir, rows, Path(tmp) / "vllm", aux, args.batch_tokens,
                                 torch.float32, vllm.EngineOptions(), vllm.check_rows_fit(rows, config),
                                 Path(tmp) / "vllm.log", timings)
        worst = worst_difference(Path(tmp), len(rows))
    return {"model": str(model_dir), "layers": layers, "hidden": verifier["hidden_size"], "aux": aux,
            "rows": len(rows), "tokens": tokens, "transformers_load_s": load_s, "transformers_s": transformers_s,
            "engine_start_s": timings["started_s"], "engine_s": timings["extract_s"],
            "transformers_tokens_per_s": tokens / transformers_s, "engine_tokens_per_s": tokens / timings["extract_s"],
            "ratio": transformers_s / timings["extract_s"],
            "ratio_with_starts": (load_s + transformers_s) / (timings["started_s"] + timings["extract_s"]),
            "max_relative_difference": worst}


def worst_difference(tmp: Path, rows: int) -> float:
    """The largest relative difference (norm over the hidden size) of a position's state, any slot, between the two
    sides' files."""
    from safetensors.torch import load_file

    worst = 0.0
    for i in range(rows):
        a, b = (load_file(str(tmp / side / f"hs_{i}.safetensors"))["hidden_states"].double()
                for side in ("vllm", "transformers"))
        worst = max(worst, float(((a - b).norm(dim=-1) / b.norm(dim=-1).clamp_min(1e-30)).max()))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, action="append",
                        help="verifier dir (repeatable; default: the tiny verifier, and SmolLM2 when built)")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--min-len", type=int, default=64)
    parser.add_argument("--max-len", type=int, default=512)
    parser.add_argument("--batch-tokens", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the engine's process inherits it
    import torch

    torch.set_num_threads(args.threads)
    models = args.model
    if not models:
        from eagle3.config import TinyVerifierConfig
        from eagle3.verifier.tiny import tiny_verifier_dir

        cache = os.environ.get("EAGLE3_CACHE") or str(Path.home() / ".cache" / "eagle3")
        models = [tiny_verifier_dir(TinyVerifierConfig(), cache)]
        models += [reference_smollm2()] if reference_smollm2().is_dir() else []
    results = []
    for model_dir in models:
        r = measure(model_dir, args)
        results.append(r)
        print(f"{model_dir.name}: {r['rows']} rows, {r['tokens']} tokens, {r['layers']} layers x {r['hidden']}, "
              f"aux {r['aux']}, {args.threads} threads\n"
              f"  transformers: {r['transformers_tokens_per_s']:.0f} tokens/s ({r['transformers_s']:.1f} s; "
              f"load {r['transformers_load_s']:.1f} s)\n"
              f"  vLLM engine:  {r['engine_tokens_per_s']:.0f} tokens/s ({r['engine_s']:.1f} s; "
              f"start {r['engine_start_s']:.1f} s)\n"
              f"  ratio engine / transformers: {r['ratio']:.2f}x extraction, {r['ratio_with_starts']:.2f}x with "
              f"the starts; largest relative difference of a state {r['max_relative_difference']:.1e}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"threads": args.threads, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
