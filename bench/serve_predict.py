"""The speedup predictor against the engine: predicted over measured speedup at each k a run was served at, for each
way of calibrating the step costs on its serve reports (eagle3.eval.speedup --engine-costs).

    python -m eagle3.serve RUN --k 1 2 3 5 --num-prompts 32 --max-new-tokens 96     # the reports (minutes)
    python bench/serve_predict.py RUN [--temperature 0] [--clock wall median cpu] [--draft-ms MS | --measure]

Calibrations: k=1 alone (per_token the draft forward's cost, fixed the rest of the k=1 step: the draft forward
eagle3.serve timed between the k=1 report's requests, or --draft-ms / --measure instead), k=1 with each other k
(step(k) = fixed + per_token * k through the two), and all k (least squares). Each row: the fit in plain steps,
then per served k predicted / measured at the accept_len that k served with (1.000: exact; `*`: a k fitted to).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the repository on sys.path)


def calibrations(ks: list[int], one_point: bool) -> list[tuple[int, ...]]:
    others = [k for k in ks if k != 1]
    return [*([(1,)] if one_point else []), *((1, k) for k in others), *([tuple(ks)] if len(ks) > 2 else [])]


def ratios(run: Path, temperature: float, clock: str, draft_ms: float | None = None) -> list[dict]:
    """Per calibration: its ks, the fit (fixed, per_token in plain steps), and k -> predicted / measured."""
    from eagle3.errors import ConfigError
    from eagle3.eval.engine_costs import engine_costs, served_step

    reports = {int(p.stem.split("_k")[1].split("_")[0]): p for p in run.glob(f"serve_vllm_k*_t{temperature:g}.json")}
    if 1 not in reports:
        raise SystemExit(f"error: {run} has no serve_vllm_k1_t{temperature:g}.json (python -m eagle3.serve RUN --k 1 "
                         "2 3 5)")
    ks = sorted(reports)
    steps = {k: served_step(reports[k], clock) for k in ks}
    rows = []
    # k=1 alone: with the draft forward given, or the one eagle3.serve timed between the k=1 report's requests
    for fitted in calibrations(ks, draft_ms is not None or steps[1].draft_ms is not None):
        try:
            costs = engine_costs([reports[k] for k in fitted], max(ks), clock, draft_ms if len(fitted) == 1 else None)
        except ConfigError as e:  # a fit with a cost below zero: noise
            rows.append({"fitted": fitted, "refused": str(e)})
            continue
        fixed, per_token = costs.verify_ms[1] / costs.baseline_ms, costs.draft_ms / costs.baseline_ms
        # predicted speedup at k's served accept_len over the measured one = measured step / predicted step
        rows.append({"fitted": fitted, "fixed": fixed, "per_token": per_token,
                     "ratio": {k: steps[k].plain_steps / (fixed + per_token * k) for k in ks}})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--clock", nargs="+", default=["wall", "median", "cpu"], choices=["wall", "median", "cpu"])
    p.add_argument("--draft-ms", type=float, help="one draft forward, ms: calibrate at k=1 alone with it")
    p.add_argument("--measure", action="store_true", help="time the run's draft forward here for the k=1 "
                                                          "calibration (one torch thread, as eagle3.eval.speedup)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    draft_ms = args.draft_ms
    if args.measure:
        from eagle3.cli.speedup import measured_draft_ms, parse_args

        draft_ms = measured_draft_ms(parse_args(["--run", str(args.run), "--measure"]))
        print(f"the run's draft forward, measured here: {draft_ms:.3f} ms")
    out = {}
    for clock in args.clock:
        rows = ratios(args.run, args.temperature, clock, draft_ms)
        out[clock] = rows
        ks = sorted(int(p.stem.split("_k")[1].split("_")[0])
                    for p in args.run.glob(f"serve_vllm_k*_t{args.temperature:g}.json"))
        print(f"{clock} time: predicted / measured speedup at each k's served accept_len")
        print(f"{'fitted to k':>14}{'step(k), plain steps':>24}" + "".join(f"{f'k={k}':>10}" for k in ks))
        for r in rows:
            if "refused" in r:
                print(f"{','.join(map(str, r['fitted'])):>14}  {r['refused'].split(': ', 1)[1]}")
                continue
            fit = f"{r['fixed']:.3f} + {r['per_token']:.3f} k"
            print(f"{','.join(map(str, r['fitted'])):>14}{fit:>24}"
                  + "".join(f"{r['ratio'][k]:>9.3f}{'*' if k in r['fitted'] else ' '}" for k in ks))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
