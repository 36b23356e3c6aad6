"""`eagle3 compare RUN_OR_SWEEP_DIR ...`: rank runs from their run dirs alone, a table and a plot.

    eagle3 compare outputs/multirun/2026-11-29/10-00-00            # a sweep dir
    eagle3 compare outputs/2026-11-29/10-00-00 outputs/...         # run dirs, or both
    eagle3 compare SWEEP --format csv --plot sweep.png
    eagle3 compare SWEEP --confirm 3       # + measured acceptance of the 3 best by tau_sim
    eagle3 compare SWEEP --forecast        # + each run's acceptance forecast (eagle3 forecast)

eagle3/sweep/compare.py says what the columns are and how the runs are ranked.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle3.cli.tail import finish
from eagle3.errors import ConfigError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="eagle3 compare", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("paths", nargs="+", type=Path, help="run dirs or sweep dirs")
    parser.add_argument("--format", choices=["plain", "markdown", "csv"], default="plain")
    parser.add_argument("--plot", type=Path, help="write a PNG of the val curves here")
    parser.add_argument("--baseline", help="a run's label (first column, e.g. '#0'): adds the step at which each "
                                           "run first reached that run's best tau_sim")
    parser.add_argument("--baseline-ms", type=float, help="with --verify-ms: adds the serving speedup each run's "
                                                           "accept rates predict (eagle3 speedup's model) and ranks by "
                                                           "it; the verifier's plain decoding, ms per token")
    parser.add_argument("--verify-ms", type=float, help="the verifier's forward over a verify step's k+1 tokens, ms")
    parser.add_argument("--draft-ms", type=float, default=0.0, help="one draft forward, ms (default 0)")
    parser.add_argument("--rank-by", choices=["tau_sim", "served"], default="tau_sim",
                        help="served: by the speedup vLLM measured (eagle3 serve's reports in the run dirs); "
                             "default: by the predicted speedup when step costs are given, else by tau_sim")
    parser.add_argument("--confirm", type=int, metavar="N", help="measure acceptance (eagle3 accept --run) of "
                        "the N best runs by tau_sim (those without an accept_k*.json yet), then rank the measured runs "
                        "by tau_sim and by accept_len side by side (0: only the rankings)")
    parser.add_argument("--forecast", action="store_true", help="adds the acceptance forecast's columns "
                        "(eagle3 forecast): accept_len at 10x each run's tokens, its 90%% band, the fitted "
                        "asymptote, the tokens to pass n-gram")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return finish(lambda: compare(args))


def compare(args: argparse.Namespace) -> int:
    costs = None
    if args.baseline_ms is not None or args.verify_ms is not None:
        if args.baseline_ms is None or args.verify_ms is None or min(args.baseline_ms, args.verify_ms) <= 0 \
                or args.draft_ms < 0:
            raise ConfigError("the predicted speedup needs --baseline-ms and --verify-ms (> 0), "
                             "and --draft-ms >= 0")
        costs = {"baseline_ms": args.baseline_ms, "verify_ms": args.verify_ms, "draft_ms": args.draft_ms}
    if args.plot and args.plot.suffix.lower() not in (".png", ".pdf", ".svg"):
        raise ConfigError(f"--plot {args.plot}: give a .png, .pdf or .svg file name")
    if args.plot and args.plot.is_symlink():  # before measuring anything; the plot is never written through one
        from eagle3.safe_write import link_message

        raise ConfigError(f"--plot: {link_message(args.plot.parent, args.plot, 'the plot')}")
    from eagle3.sweep.compare import confirm, rankings_text, render, served_report, table
    from eagle3.sweep.plot import plot, study_history
    from eagle3.sweep.runs import find_runs

    runs = find_runs(args.paths)
    failed_measurements = confirm(runs, args.confirm) if args.confirm is not None else []
    sys.stdout.write(render(*table(runs, args.baseline, costs, args.rank_by, args.forecast), args.format))
    if args.confirm is not None:
        sys.stdout.write(rankings_text(runs, args.format))
    if args.plot:
        plot(runs, args.plot, study_history(args.paths))
        print(f"plot: {args.plot}", file=sys.stderr)
    for run in runs:  # the table says "not a result"; here is why
        flagged = served_report(run)
        if flagged and flagged.get("not_a_result"):
            print(f"warning: run {run.label}: {flagged['path']} is not a result, not ranked: "
                  f"{'; '.join(flagged['not_a_result'])}", file=sys.stderr)
    unreadable = [r for r in runs if r.status == "unreadable"]
    for run in unreadable:  # shown in the table with what its metrics hold; its numbers may be incomplete
        print(f"error: run {run.label}: {run.error}", file=sys.stderr)
    return 1 if failed_measurements or unreadable else 0
