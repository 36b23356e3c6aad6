"""Forecast acceptance from a pilot run: where it ends up, and how many tokens and hours to beat n-gram or a target.

    eagle3 forecast RUN                          # accept_len at 2x, 10x, 100x the tokens so far
    eagle3 forecast RUN --target 1.5 --at 1M 10M # + tokens and hours to reach 1.5, these budgets
    eagle3 forecast RUN --ngram 1.147            # the n-gram baseline (default: the run's serve report)
    eagle3 forecast RUN --until 200              # from the val passes up to step 200 only
    eagle3 forecast SWEEP --target 1.5           # every run of a sweep, ranked by tokens to 1.5
    eagle3 forecast RUN --json                   # one JSON object (a list `at` of the budgets)

Fits tau_sim(t) = a - b (t / t_ref)^-c to the val passes against trained tokens (eagle3.sweep.curve_fit), carried to
measured accept_len by the ratio at measured checkpoints, with 90% bootstrap intervals (docs/forecast.md). Where the
run's lr schedule is known (cosine, linear or constant over its planned steps), t counts tokens x lr / peak and an
anneal term adds what the lr's decay gains: the planned run's end is forecast from a pilot of its first steps.
It refuses runs with fewer than 4 val passes after step 0, or whose tau_sim has not risen 0.02 above its start.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from eagle3.cli.tail import finish
from eagle3.errors import ForecastError, UserError

SUFFIXES = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def token_count(text: str) -> float:
    """500k, 1.5M, 2e6 -> tokens."""
    scale = SUFFIXES.get(text[-1:].lower(), 1.0)
    try:
        value = float(text[:-1] if scale != 1.0 else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a token count (e.g. 500k, 1.5M, 2e6)") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: a token count is a positive number")
    return value


def positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give a positive number")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="eagle3 forecast", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("paths", nargs="+", type=Path, help="run dirs or sweep dirs")
    p.add_argument("--target", type=positive, help="accept_len to reach: tokens and hours to it")
    p.add_argument("--ngram", type=positive, help="the n-gram baseline's accept_len (default: the ngram block of "
                                                  "the run's serve_vllm_k<k>_t0.json, if served)")
    p.add_argument("--at", type=token_count, nargs="+", default=[], metavar="TOKENS",
                   help="token budgets to forecast besides 2x, 10x, 100x the tokens so far (500k, 1M, 2e6)")
    p.add_argument("--until", type=int, metavar="STEP", help="use only the val passes up to this step (check a "
                                                             "finished run against its own forecast)")
    p.add_argument("--until-tokens", type=token_count, metavar="TOKENS", help="use only the val passes up to these "
                                                                              "trained tokens")
    p.add_argument("--tokens-per-s", type=positive, help="training rate for the hours (default: the run's measured)")
    p.add_argument("--baseline-ms", type=positive, help="with --verify-ms: step costs for the predicted speedup "
                                                        "(default: the run's served step, if served)")
    p.add_argument("--verify-ms", type=positive, help="the verifier's verify step, ms")
    p.add_argument("--draft-ms", type=float, default=0.0, help="one draft forward, ms (default 0)")
    p.add_argument("--horizon", type=positive, default=1000.0, help="'not within N tokens' beyond this multiple of "
                                                                    "the tokens so far (default 1000)")
    p.add_argument("--anneal-prior", type=float, nargs=2, metavar=("MEAN", "SD"),
                   help="the prior of the anneal term's r, the tau_sim a full anneal adds in slopes per e-fold of "
                        "tokens (default 2.3 1.0, from SmolLM2's reference runs; docs/forecast.md)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", type=Path, help="write a PNG of the points, the fitted curve and its band here")
    p.add_argument("--wandb", action="store_true", help="also write the forecast into the run's wandb run "
                                                        "(summary values and the curve), by its stored id")
    return p.parse_args(argv)


def options_of(args: argparse.Namespace):
    from eagle3.sweep.forecast import Options

    if (args.baseline_ms is None) != (args.verify_ms is None) or args.draft_ms < 0:
        raise UserError("the predicted speedup's step costs need --baseline-ms and --verify-ms together "
                        "(--draft-ms >= 0)")
    if args.until is not None and args.until < 1:
        raise UserError(f"--until {args.until}: give a step after step 0")
    if args.plot and args.plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise UserError(f"--plot {args.plot}: give a .png, .pdf or .svg file name")
    if args.anneal_prior is not None and not (args.anneal_prior[0] >= 0 and args.anneal_prior[1] > 0):
        raise UserError(f"--anneal-prior {args.anneal_prior[0]:g} {args.anneal_prior[1]:g}: give a mean >= 0 and an "
                        "sd > 0")
    costs = None if args.baseline_ms is None else {"baseline_ms": args.baseline_ms, "verify_ms": args.verify_ms,
                                                   "draft_ms": args.draft_ms}
    options = Options(target=args.target, ngram=args.ngram, at=list(args.at), until_step=args.until,
                      until_tokens=args.until_tokens, tokens_per_s=args.tokens_per_s, costs=costs,
                      horizon=args.horizon)
    if args.anneal_prior is not None:
        options.anneal_prior = (args.anneal_prior[0], args.anneal_prior[1])
    return options


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return finish(lambda: forecast(args))


def forecast(args: argparse.Namespace) -> int:
    options = options_of(args)
    from eagle3.sweep.forecast import forecast_run, rank_reports
    from eagle3.sweep.runs import find_runs

    runs = find_runs(args.paths)
    reports, refused = [], []
    for run in runs:
        try:
            reports.append((run, forecast_run(run, options)))
        except ForecastError as e:
            refused.append({"run": str(run.path), "label": run.label, "error": str(e)})
    if not reports:
        raise ForecastError("; ".join(r["error"] for r in refused))
    ranked = rank_reports([r for _, r in reports])
    print_reports(ranked, refused, args.json)
    if args.plot:
        from eagle3.sweep.forecast_plot import plot

        plot(ranked, args.plot)
        print(f"plot: {args.plot}", file=sys.stderr)
    if args.wandb:
        from eagle3.sweep.forecast_wandb import log_forecast

        for run, report in reports:
            print(f"{run.label}: {log_forecast(run, report)}", file=sys.stderr)
    return 0


def print_reports(ranked: list[dict], refused: list[dict], as_json: bool) -> None:
    from eagle3.sweep.forecast_text import format_report, ranking_text

    if as_json:
        out = ranked[0] if len(ranked) == 1 and not refused else {"ranking": ranked, "refused": refused}
        print(json.dumps(out, indent=1))
        return
    print("\n\n".join(format_report(r) for r in ranked))
    if len(ranked) > 1:
        goal = ranked[0]["reach"][0]["name"] if ranked[0]["reach"] else None
        by_end = all(r.get("planned_end") for r in ranked)
        print(f"\n{len(ranked)} runs ranked by " + (f"tokens to {goal}:" if goal else "accept_len at the end of the "
                                                     "planned run:" if by_end else "accept_len at 10x:"))
        print(ranking_text(ranked))
    for r in refused:
        print(f"not forecast: {r['label']}: {r['error']}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
