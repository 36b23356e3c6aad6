"""One served run's report at one k (serve_vllm_k<k>_t<T>.json): the engine's figures beside the harness's and the
n-gram baseline's, and the lines it is printed as."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from eagle3.serve.request import ServedRun, ServeRequest


def build_report(measured: dict[str, Any], reference: dict[str, Any], k: int, args: ServeRequest, engine,
                 run: ServedRun, log: Path, first_plain: float | None = None) -> dict[str, Any]:
    """The report of one run at one k. `first_plain`: the plain server's tokens/s in the command's first
    measurement, against which this one's is checked."""
    from eagle3.serve.harness import side_by_side
    from eagle3.serve.metrics import acceptance, implausible

    spec, plain = measured["spec"], measured["plain"]
    served = {**acceptance(spec["counters"], k), "tokens": spec["tokens"], "per_prompt": spec["per_prompt"]}
    speedups = {"speedup": spec["tokens_per_s"] / plain["tokens_per_s"],
                # Each prompt's plain time over its speculative time (both made the same number of tokens), the
                # median: a burst of load from another job moves one pair, not the result.
                "speedup_median": statistics.median(a / b for a, b in zip(plain["seconds"], spec["seconds"]))}
    report = {
        "engine": engine.name, "engine_version": engine.version, "engine_python": str(engine.python),
        "dtype": args.dtype, "k": k, "temperature": args.temperature, "seed": args.seed,
        "prompts": len(spec["tokens"]), "max_new_tokens": args.max_new_tokens, "prompt_source": run.source,
        **{key: served[key] for key in ("drafts", "draft_tokens", "accepted", "accepted_per_position",
                                        "accept_rate", "accept_len", "accept_len_se")},
        "tokens_generated": spec["tokens_generated"], "tokens_per_s": spec["tokens_per_s"],
        "plain_tokens_per_s": plain["tokens_per_s"], **speedups,
        "tokens_per_cpu_s": spec["tokens_per_cpu_s"], "plain_tokens_per_cpu_s": plain["tokens_per_cpu_s"],
        "speedup_cpu": spec["tokens_per_cpu_s"] / plain["tokens_per_cpu_s"],
        "plain_turn_tokens_per_s": plain["turn_tokens_per_s"],
        # Why these figures are not a result (a speedup the acceptance cannot give, a machine whose speed moved
        # under the measurement); eagle3.sweep.compare ranks no report that has a reason here.
        "implausible": implausible(speedups, served["accept_len"], plain["turn_tokens_per_s"], first_plain),
        "same_tokens_as_plain": spec["tokens"] == plain["tokens"],
        "harness": {**{key: reference[key] for key in ("drafts", "accepted_per_position", "accept_rate",
                                                        "accept_len", "accept_len_se")},
                    **side_by_side(served, reference, args.temperature, args.dtype)},
        "per_prompt": {"engine": spec["per_prompt"], "harness": reference["per_prompt"]},
        "checkpoint": str(run.checkpoint), "verifier": str(run.verifier_dir), "log": str(log),
        # engine steps less one prefill per prompt: equal to drafts for a drafter that drafts at every step
        "verify_steps": spec["counters"].steps - len(spec["tokens"]) if spec["counters"].steps else None,
    }
    if "ngram" in measured:
        report["ngram"] = ngram_report(measured["ngram"], plain, k, args)
    return report


def ngram_report(ngram: dict[str, Any], plain: dict[str, Any], k: int, args: ServeRequest) -> dict[str, Any]:
    """vLLM's n-gram proposer on the same prompts, in the same turns: its acceptance over every verify step (not
    only those it found a match for, which vLLM's logged mean acceptance length averages), tokens/s, speedup."""
    from eagle3.serve.metrics import all_steps_acceptance, implausible

    acceptance = all_steps_acceptance(ngram["counters"], k, len(ngram["tokens"]))
    speedups = {"speedup": ngram["tokens_per_s"] / plain["tokens_per_s"],
                "speedup_median": statistics.median(a / b for a, b in zip(plain["seconds"], ngram["seconds"]))}
    return {"method": "ngram", "prompt_lookup_min": args.ngram_min, "prompt_lookup_max": args.ngram_max, "k": k,
            **acceptance, "tokens_per_s": ngram["tokens_per_s"], "tokens_per_cpu_s": ngram["tokens_per_cpu_s"],
            **speedups, "speedup_cpu": ngram["tokens_per_cpu_s"] / plain["tokens_per_cpu_s"],
            "same_tokens_as_plain": ngram["tokens"] == plain["tokens"],
            "implausible": implausible(speedups, acceptance["accept_len"], [])}


def format_report(r: dict[str, Any]) -> str:
    side_by_side = []
    ngram = r.get("ngram")
    if ngram is not None:  # EAGLE-3, n-gram and plain in the same turns, one row each
        rows = [(f"EAGLE-3 (k={r['k']})", r["accept_len"], r["tokens_per_s"], r["speedup"]),
                (f"n-gram (k={ngram['k']}, match {ngram['prompt_lookup_min']}-{ngram['prompt_lookup_max']})",
                 ngram["accept_len"], ngram["tokens_per_s"], ngram["speedup"]),
                ("plain", 1.0, r["plain_tokens_per_s"], 1.0)]
        side_by_side = [f"  {'':<26}{'accept_len':>11}{'tokens/s':>10}{'speedup':>9}",
                        *(f"  {name:<26}{_or_dash(al, 11, 4)}{tps:>10.1f}{speedup:>9.3f}"
                          for name, al, tps, speedup in rows),
                        f"  n-gram's accept_len is over all its {ngram['verify_steps']} verify steps; over the "
                        f"{ngram['drafts']} it found a match for (vLLM's logged mean acceptance length) it is "
                        f"{_or_dash(ngram['accept_len_drafted'], 0, 4).strip()}"]
        if ngram["implausible"]:
            side_by_side.append(f"  n-gram IMPLAUSIBLE, not a result: {'; '.join(ngram['implausible'])}")
    return "\n".join([
        f"vLLM ({r['engine']} {r['engine_version']}, {r['dtype']}): k={r['k']}, T={r['temperature']:g}, "
        f"{r['prompts']} prompts x {r['max_new_tokens']} tokens",
        f"  accept_len {r['accept_len']:.4f} (harness {r['harness']['accept_len']:.4f}), drafts {r['drafts']}, "
        f"accepted per position {r['accepted_per_position']}",
        f"  tokens/s {r['tokens_per_s']:.1f} with speculation, {r['plain_tokens_per_s']:.1f} without: speedup "
        f"{r['speedup']:.3f} (median over prompts {r['speedup_median']:.3f}; in the servers' CPU time "
        f"{r['speedup_cpu']:.3f})",
        *([f"  IMPLAUSIBLE, not a result: {'; '.join(r['implausible'])}"] if r["implausible"] else []),
        *side_by_side,
        f"  {r['harness']['verdict']}",
        f"  report: {r['report_path']}",
    ])


def _or_dash(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"
