"""Draft architectures side by side, from the run dirs of sweeps over them (docs/architectures.md).

    python bench/architectures.py SWEEP [SWEEP ...]      # a markdown table, best arm first

One row per arm (draft kind, decoder layers, layer type, EAGLE-3.1), over its runs (seeds): the mean and the
spread (sample standard deviation, +-) of the final val pass's measured accept_len (eval.accept at that pass) and
of the best val tau_sim, and what the plan (eagle3/plan/memory.py) says one training step of that arm costs on this
machine's kind of device: trainable parameters, FLOPs per optimizer step and the planned peak per rank. Ranked by
the mean accept_len.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def arm(draft) -> str:
    if draft.kind.value == "dflash":
        return f"DFlash block {draft.ttt_steps + 1}, {draft.num_layers} x qwen3"
    name = "P-EAGLE" if draft.kind.value == "peagle" else "EAGLE-3.1" if draft.eagle31 else "EAGLE-3"
    return f"{name}, {draft.num_layers} x {draft.layer_type.value}"


def run_row(run: Path) -> dict | None:
    import yaml

    from eagle3.config import validate
    from eagle3.data.sources import source_of
    from eagle3.plan.memory import make_plan
    from eagle3.plan.parts import Machine, PlannedRun, SourceFacts

    summary_path, config_path = run / "summary.json", run / "resolved_config.yaml"
    if not (summary_path.is_file() and config_path.is_file()):
        return None
    summary = json.loads(summary_path.read_text())
    plain = yaml.safe_load(config_path.read_text())
    plain.pop("run", None)
    cfg = validate(plain, dataset_required=False)
    terms = source_of(cfg.data).buffer_terms(cfg.model.draft, "cpu")
    plan = make_plan(PlannedRun.of(cfg), Machine("cpu"), SourceFacts(terms))
    return {"arm": arm(cfg.model.draft), "accept_len": summary["final"].get("accept_len"),
            "tau_sim": summary["best"]["tau_sim"], "trainable": plan.trainable_params,
            "flops": plan.flops_per_step, "peak": sum(t.bytes for t in plan.terms if t.on_device),
            "train_wall_s": summary["train_wall_s"]}


def mean_spread(values: list[float]) -> str:
    if len(values) < 2:
        return f"{values[0]:.4f}"
    return f"{statistics.mean(values):.4f} +- {statistics.stdev(values):.4f}"


def table(rows: list[dict]) -> str:
    arms: dict[str, list[dict]] = {}
    for r in rows:
        arms.setdefault(r["arm"], []).append(r)
    ranked = sorted(arms.items(), key=lambda kv: -statistics.mean(r["accept_len"] for r in kv[1]))
    lines = ["| draft | runs | accept_len (measured) | best val tau_sim | trainable params | GFLOP / step "
             "(plan) | planned peak MiB (CPU) | train s / run |",
             "|---|---|---|---|---|---|---|---|"]
    for name, runs in ranked:
        first = runs[0]
        lines.append(f"| {name} | {len(runs)} | {mean_spread([r['accept_len'] for r in runs])} | "
                     f"{mean_spread([r['tau_sim'] for r in runs])} | {first['trainable']:,} | "
                     f"{first['flops'] / 1e9:.1f} | {first['peak'] / 2**20:.1f} | "
                     f"{statistics.mean(r['train_wall_s'] for r in runs):.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweeps", nargs="+", type=Path, help="sweep dirs (or run dirs)")
    args = parser.parse_args(argv)
    from eagle3.console import quiet_libraries

    quiet_libraries()
    runs = [p for s in args.sweeps for p in ([s] if (s / "summary.json").is_file() else sorted(s.iterdir()))
            if p.is_dir()]
    rows = [r for r in map(run_row, runs) if r is not None and r["accept_len"] is not None]
    if not rows:
        raise SystemExit("error: no finished run with a measured accept_len (eval.accept.enabled=true) in "
                         f"{', '.join(map(str, args.sweeps))}")
    print(table(rows))


if __name__ == "__main__":
    main()
