"""`eagle3 accept`: measured acceptance, chain speculative decoding with the Hugging Face verifier and a trained draft.

    eagle3 accept --run outputs/<date>/<time>                  # the run's best draft, val prompts
    eagle3 accept CKPT --verifier DIR --prompts p.jsonl --k 4   # any checkpoint and verifier
    eagle3 accept --run RUN --temperature 0.7                   # acceptance when serving at T

Prints a table and writes a JSON report (`--out`; with `--run`, `<run>/accept_k<k>.json` by default, or
`accept_k<k>_t<T>.json` at T > 0, never overwritten). At temperature 0 the speculative output is checked
against the verifier's plain greedy decoding on every run; a difference exits non-zero naming the first
prompt and position. At T > 0 it is speculative sampling (seeded), lossless in distribution (eagle3/eval/accept.py).
"""

from __future__ import annotations

import argparse
from typing import Any

from eagle3.cli.tail import finish

# The options a training run's eval.accept also has: their defaults, help and checks are its schema's.
SCHEMA_FLAGS = {"num_prompts": "--num-prompts", "k": "--k", "max_new_tokens": "--max-new-tokens",
                "temperature": "--temperature"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from eagle3.cli.fields import add_fields
    from eagle3.config import AcceptEvalConfig, Device

    p = argparse.ArgumentParser(prog="eagle3 accept", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", nargs="?", help="draft checkpoint dir (speculators format); with --run: the "
                                                 "run's checkpoints/best unless given")
    p.add_argument("--verifier", help="verifier dir (local Hugging Face causal LM); with --run: the run's")
    p.add_argument("--run", help="a finished run dir: checkpoint, verifier and val-split prompts from its "
                                 "summary.json and resolved_config.yaml")
    p.add_argument("--prompts", help="{\"input_ids\": [...]} rows or conversations ({\"messages\"}, ShareGPT's "
                                     "{\"conversations\"}: up to the first assistant turn) in a JSONL file, a JSON "
                                     "array, Parquet or a datasets dir (default with --run: the prompts of the run's "
                                     "val split)")
    add_fields(p, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept", defaults={"k": None}, helps={
        "k": "draft tokens per verify step (default: the checkpoint's speculative_tokens, its training ttt_steps)"})
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator at temperature > 0 "
                                                       "(a training run's val passes use its seed)")
    p.add_argument("--no-cache", dest="cached", action="store_false",
                   help="recompute every forward over the whole prefix (the slower reference harness)")
    p.add_argument("--out", help="JSON report path (overwritten if it exists)")
    p.add_argument("--device", default=Device.auto.value, choices=[d.value for d in Device])
    p.add_argument("--attn-impl", default="sdpa", choices=["sdpa", "eager"], help="the draft's attention")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default on CPU: 1; many small "
                                                             "forwards gain little from more, and lose a lot "
                                                             "when the cores are shared)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return finish(lambda: measure(args))


def measure(args: argparse.Namespace) -> int:
    from eagle3.cli.fields import checked
    from eagle3.config import AcceptEvalConfig

    checked(args, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept", AcceptEvalConfig.check_values)  # before torch
    from eagle3.eval.accept import AcceptRequest, run
    from eagle3.eval.measure import LosslessError

    try:
        report = run(AcceptRequest(**vars(args)))
    except LosslessError as e:  # the speculative output differs from the verifier's own: a finding, not a bug
        raise SystemExit(f"error: {e}") from None
    print(format_report(report))
    print(f"report: {report['report_path']}" if report.get("report_path") else "report: not written (no --out)")
    return 0


def format_report(r: dict[str, Any]) -> str:
    """A short table: measured acceptance beside the teacher-forced estimate on the same sequences."""
    sampled = r["temperature"] > 0
    how = f"temperature {r['temperature']:g} (seed {r['seed']})" if sampled else "greedy"
    lines = [
        f"acceptance: k={r['k']}, {how}, {r['prompts']} prompts x {r['max_new_tokens']} new tokens, "
        f"{r['verify_steps']} verify steps, {r['wall_s']:.1f} s ({'KV-cached' if r['cached'] else 'uncached'})",
        f"{'accept_len':<14}{r['accept_len']:>10.4f}   measured: tokens per verify step (bonus token included)",
        f"{'tau_sim':<14}{r['tau_sim']:>10.4f}   teacher-forced on the same sequences, "
        f"ttt_steps={r['tau_sim_ttt_steps']}",
        f"{'chain_len':<14}{r['chain_len_mean']:>10.4f}   mean over positions of the chain a draft started there "
        f"would get accepted; harmonic mean {r['chain_len_harmonic']:.4f}" if r["chain_len_mean"] is not None else
        f"{'chain_len':<14}{'-':>10}   (a P-EAGLE or DFlash draft's training forward proposes no chains)",
        f"{'position':<14}{'accept_rate':>12}{'full_acc':>12}",
    ]
    for j in range(max(r["k"], r["tau_sim_ttt_steps"])):
        cells = [r["accept_rate"][j] if j < r["k"] else None, r["full_acc"][j] if j < len(r["full_acc"]) else None]
        lines.append(f"{j:<14}" + "".join(f"{c:>12.4f}" if c is not None else f"{'-':>12}" for c in cells))
    if sampled:
        lines.append(f"sampled tokens outside the draft vocabulary: {100 * r['sampled_outside_draft_vocab']:.1f}%")
        lines.append("lossless in distribution (speculative sampling; checked by the test suite, not per run)")
    else:
        lines.append(f"greedy tokens outside the draft vocabulary: {100 * r['greedy_outside_draft_vocab']:.1f}%")
        lines.append(f"lossless: the speculative output equals the verifier's greedy output for all {r['prompts']} "
                     "prompts")
    return "\n".join(lines)
