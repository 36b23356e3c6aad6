"""Does a drafter pay off? The serving speedup that per-position accept rates predict at given step costs.

    eagle3 speedup --accept-rates 0.5 0.3 0.2 --baseline-ms 12.2 --verify-ms 30 --draft-ms 1
    eagle3 speedup --accept RUN/accept_k3.json --run RUN --measure     # costs measured here
    eagle3 speedup --run RUN --measure --wallclock                     # and checked by decoding
    eagle3 speedup --accept RUN/serve_vllm_k5_t0.json \
        --engine-costs RUN/serve_vllm_k1_t0.json RUN/serve_vllm_k5_t0.json   # costs of served runs (eagle3.serve)
    eagle3 speedup --accept RUN/serve_vllm_k5_t0.json \
        --engine-costs RUN/serve_vllm_k1_t0.json           # k=1 served, the draft timed by eagle3.serve meanwhile

The model, the engine's step costs and what each option means: eagle3/eval/speedup.py, eagle3/eval/engine_costs.py.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.cli.tail import finish
from eagle3.errors import ConfigError, UserError

if TYPE_CHECKING:
    from eagle3.eval.accept import AcceptRequest
    from eagle3.eval.speedup import StepCosts

# --wallclock decodes as eagle3.eval.accept does: these options' checks are its schema's.
WALLCLOCK_FLAGS = {"num_prompts": "--num-prompts", "max_new_tokens": "--max-new-tokens"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from eagle3.cli.fields import add_fields
    from eagle3.config import AcceptEvalConfig, Device
    from eagle3.eval import speedup

    p = argparse.ArgumentParser(prog="eagle3 speedup", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=speedup.__doc__.split("\n\n", 2)[2])
    p.add_argument("--accept", type=Path, help="an eagle3 accept report (accept_k*.json): measured rates")
    p.add_argument("--accept-rates", type=float, nargs="+", metavar="R", help="per-position accept rates r_0 r_1 ...")
    p.add_argument("--run", type=Path, help="a finished run dir: its best val full_acc_* as rates (an estimate) "
                                            "unless --accept/--accept-rates; its draft and verifier for --measure")
    p.add_argument("--checkpoint", help="draft checkpoint dir for --measure (default with --run: its best)")
    p.add_argument("--verifier", help="verifier dir for --measure (default with --run: the run's)")
    p.add_argument("--baseline-ms", type=float, help="the verifier's plain decoding: ms per token")
    p.add_argument("--verify-ms", type=float, nargs="+", metavar="MS",
                   help="the verifier's forward over k+1 tokens, ms: one value for every k, or one per k")
    p.add_argument("--draft-ms", type=float, help="one draft forward, ms (default 0; with one --engine-costs "
                                                   "report at k=1: the cost of each draft token)")
    p.add_argument("--measure", action="store_true", help="measure the step costs here with the draft and verifier")
    p.add_argument("--engine-costs", type=Path, nargs="+", metavar="SERVE_JSON",
                   help="step costs from eagle3 serve reports: step(k) = fixed + per_token * k plain steps, fitted "
                        "to reports at two or more k (e.g. k=1 and the largest), or from one at k=1 with per_token "
                        "the draft forward's cost (the one eagle3.serve timed between its requests, or --measure, "
                        "or --draft-ms); the serve reports at every k beside "
                        "the first are shown as measured, with the speedup the costs predict at the accept_len "
                        "each served with")
    p.add_argument("--context", type=int, default=64, help="context length (tokens) the costs are measured at")
    p.add_argument("--wallclock", action="store_true", help="also decode the run's val prompts with and without "
                                                            "speculation and compare the measured ratio (needs --run)")
    add_fields(p, AcceptEvalConfig, WALLCLOCK_FLAGS, "eval.accept", defaults={"max_new_tokens": 64},
               helps={"num_prompts": "prompts decoded by --wallclock",
                      "max_new_tokens": "tokens per prompt for --wallclock"})
    p.add_argument("--device", default=Device.auto.value, choices=[d.value for d in Device])
    p.add_argument("--clock", choices=["wall", "cpu", "median"], default=None,
                   help="what --measure times (default: cpu time on a CPU with one torch thread, which a busy "
                        "shared machine does not stretch; wall time on a GPU); with --engine-costs: which of the "
                        "serve reports' speedups (default wall; median: of the per-prompt ratios)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default on CPU: 1)")
    p.add_argument("--json", type=Path, help="write the prediction here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return finish(lambda: predicted(args))


def predicted(args: argparse.Namespace) -> int:
    if args.json is not None and args.json.exists():
        raise ConfigError(f"--json: {args.json} exists; nothing was overwritten: choose another path")
    if args.json is not None:  # before measuring: its dir must be one that can be made and written
        from eagle3.rundir.files import output_dir_problem

        problem = output_dir_problem(args.json.parent.absolute())
        if problem:
            raise ConfigError(f"--json: {problem}; choose another path")
    result, text = run(args)
    print(text)
    if args.json:
        from eagle3.safe_write import write_text

        try:
            write_text(args.json.parent, args.json, json.dumps(result, indent=2) + "\n")
        except UserError as e:  # a symlink at --json: never written through
            raise ConfigError(f"--json: {e}") from None
        print(f"json: {args.json}")
    return 0


def run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """(the prediction as the JSON report holds it, as it is printed)."""
    from eagle3.eval.engine_costs import against_engine
    from eagle3.eval.speedup import check_rates, format_prediction, predict, rates_from_report, rates_from_run

    sources = [s for s in (args.accept, args.accept_rates) if s is not None]
    if len(sources) > 1:
        raise ConfigError("give one source of accept rates: --accept or --accept-rates")
    if args.accept is not None:
        rates, source = rates_from_report(args.accept)
    elif args.accept_rates is not None:
        rates, source = args.accept_rates, "given"
    elif args.run is not None:
        rates, source = rates_from_run(args.run)
    else:
        raise ConfigError("give accept rates: --accept accept_k*.json, --accept-rates r0 r1 ..., or --run RUN "
                          "(its val full_acc_*, an estimate)")
    rates = check_rates(rates)
    ks = list(range(1, len(rates) + 1))
    if args.engine_costs is not None:
        if args.wallclock or args.baseline_ms is not None or args.verify_ms is not None:
            raise ConfigError("give one source of step costs: --engine-costs (with --measure or --draft-ms for one "
                              "report at k=1), --measure, or --baseline-ms/--verify-ms")
        if args.measure and args.draft_ms is not None:
            raise ConfigError("give the draft forward's cost once: --measure (measured here) or --draft-ms")
        draft_ms = measured_draft_ms(args) if args.measure else args.draft_ms
        return against_engine(rates, source, args.engine_costs, args.clock or "wall", draft_ms)
    if not (args.measure or args.wallclock):
        costs = given_costs(args, len(rates))
        prediction = predict(rates, costs)
        return {**prediction, "accept_source": source}, format_prediction(prediction, source)
    return measured(args, rates, source, ks)


def measured(args: argparse.Namespace, rates: list[float], source: str, ks: list[int]) -> tuple[dict[str, Any], str]:
    """The prediction from step costs measured here (--measure), and with --wallclock held against decoding."""
    from eagle3.cli.fields import checked
    from eagle3.config import AcceptEvalConfig

    if args.wallclock and args.run is None:
        raise ConfigError("--wallclock decodes the val prompts of a run: give --run")
    checked(args, AcceptEvalConfig, WALLCLOCK_FLAGS, "eval.accept", AcceptEvalConfig.check_values)
    for flag, value, low in (("--context", args.context, 2), ("--threads", args.threads or 1, 1)):
        if value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    from eagle3.device.threads import torch_threads  # torch: after the options are checked
    from eagle3.eval.speedup import default_clock, format_prediction, measure_costs, predict, wallclock

    verifier, draft, device = load_models(args)
    max_positions = getattr(verifier.config, "max_position_embeddings", None) or 1 << 30
    if args.context + len(rates) + 1 > max_positions:
        raise ConfigError(f"--context {args.context} + a verify step of {len(rates) + 1} tokens passes the verifier's "
                          f"max_position_embeddings ({max_positions})")
    with torch_threads(args.threads or (1 if device == "cpu" else None)):
        clock = args.clock or default_clock(device)
        costs = measure_costs(verifier, draft, ks, args.context, clock=clock)
        prediction = predict(rates, costs)
        result = {**prediction, "accept_source": source, "verify_ms": costs.verify_ms}
        text = format_prediction(prediction, source)
        if args.wallclock:
            from eagle3.eval.accept import resolve_inputs
            from eagle3.eval.prompts import val_split_prompts

            val_split = resolve_inputs(accept_args(args))[2]
            assert val_split is not None  # --wallclock requires --run, whose val split it is
            data_dir, train_ratio = val_split
            prompts = val_split_prompts(data_dir, train_ratio, args.num_prompts)
            rows = wallclock(verifier, draft, prompts, ks, args.max_new_tokens,
                             lambda: measure_costs(verifier, draft, ks, args.context, clock=clock))
            result["wallclock"] = rows
            text += "\n" + format_wallclock(rows, len(prompts), args.max_new_tokens)
    return result, text


def measured_draft_ms(args: argparse.Namespace) -> float:
    """One draft forward of the run's draft, measured here as --measure measures it (its --threads: give the
    threads the engine's worker runs with)."""
    from eagle3.device.threads import torch_threads
    from eagle3.eval.speedup import default_clock, measure_costs

    verifier, draft, device = load_models(args)
    with torch_threads(args.threads or (1 if device == "cpu" else None)):
        return measure_costs(verifier, draft, [1], args.context, clock=default_clock(device)).draft_ms


def format_wallclock(rows: list[dict[str, Any]], prompts: int, max_new_tokens: int) -> str:
    lines = [f"decoding, KV-cached harness, {prompts} prompts x {max_new_tokens} greedy tokens, speculative vs plain; "
             "medians over rounds, each predicted from its own measured costs and the rates its decoding measured:",
             f"{'k':>3}{'accept_len':>12}{'predicted':>11}{'wall':>8}{'error':>8}{'cpu':>8}{'error':>8}"]
    for r in rows:
        lines.append(f"{r['k']:>3}{1 + sum(r['accept_rate']):>12.3f}{r['predicted_speedup']:>11.3f}"
                     f"{r['measured_speedup_wall']:>8.3f}{100 * r['error_wall']:>7.1f}%"
                     f"{r['measured_speedup_cpu']:>8.3f}{100 * r['error_cpu']:>7.1f}%")
    return "\n".join(lines)


def accept_args(args: argparse.Namespace) -> AcceptRequest:
    from eagle3.eval.accept import AcceptRequest

    return AcceptRequest(checkpoint=args.checkpoint, verifier=args.verifier,
                         run=None if args.run is None else str(args.run), prompts=None if args.run else "-")


def load_models(args: argparse.Namespace):
    """The draft and verifier of --run or --checkpoint/--verifier, as eagle3.eval.accept loads them."""
    import torch

    from eagle3.console import quiet_libraries
    from eagle3.eval.accept import resolve_inputs
    from eagle3.init.checkpoint import load_draft
    from eagle3.verifier.model import Verifier

    if args.run is None and not (args.checkpoint and args.verifier):
        raise ConfigError("--measure needs the models: --run RUN, or --checkpoint and --verifier")
    checkpoint, verifier_dir, _ = resolve_inputs(accept_args(args))
    quiet_libraries()
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    verifier = Verifier(verifier_dir, key="--verifier").load(device)
    try:
        draft = load_draft(checkpoint, "sdpa", device, verifier_dir=verifier_dir).float().eval()
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the draft {checkpoint} for the verifier {verifier_dir}: {e}") from None
    return verifier, draft, device




def given_costs(args: argparse.Namespace, max_k: int) -> StepCosts:
    from eagle3.eval.speedup import StepCosts

    if args.baseline_ms is None or args.verify_ms is None:
        raise ConfigError("give the step costs (--baseline-ms and --verify-ms, optionally --draft-ms) or --measure")
    verify = args.verify_ms
    if len(verify) not in (1, max_k):
        raise ConfigError(f"--verify-ms takes one value (the same for every k) or one per k = 1..{max_k}, "
                          f"got {len(verify)}")
    draft_ms = args.draft_ms or 0.0
    values = [args.baseline_ms, *verify, draft_ms]
    if not all(math.isfinite(v) and v >= 0 for v in values) or args.baseline_ms <= 0 or min(verify) <= 0:
        raise ConfigError(f"step costs must be positive, finite milliseconds (--draft-ms may be 0), got baseline "
                          f"{args.baseline_ms}, verify {verify}, draft {draft_ms}")
    return StepCosts(args.baseline_ms, {k: verify[0 if len(verify) == 1 else k - 1] for k in range(1, max_k + 1)},
                     draft_ms, "given")
