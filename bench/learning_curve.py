"""The learning curve of docs/learning_curve.sh: its measurement points and its report.

    python bench/learning_curve.py points DIR --budgets 50000 100000 ...   # a run dir per (seed, budget)
    python bench/learning_curve.py unmeasured DIR                          # the points with no vLLM report yet
    python bench/learning_curve.py report DIR [--png P] [--csv C]          # table (stdout), CSV and picture

DIR holds one training run per seed (`seed_<s>/`, with `snapshots/ck_*`: copies of checkpoints/last at each save).
A point is `DIR/points/seed_<s>_<tokens>/`: the run's resolved_config.yaml and summary.json, and as
checkpoints/best the snapshot whose trained tokens (its trainer_state.pt) are nearest the budget, which is what
`python -m eagle3.serve` measures. The report reads each point's serve_vllm_k3_t0.json (accept_len, its standard
error, tokens/s, speedup) and the first report's n-gram block; the CSV has a row per measured point and one each for
n-gram and plain.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

REPORT = "serve_vllm_k3_t0.json"


def snapshot_progress(snapshot: Path) -> dict:
    import torch

    state = torch.load(snapshot / "trainer_state.pt", map_location="cpu", weights_only=True)
    return state["progress"]


def make_points(root: Path, budgets: list[int]) -> list[Path]:
    made = []
    for run in sorted(root.glob("seed_*")):
        if not (run / "summary.json").is_file():
            print(f"{run}: not finished (no summary.json), no points", file=sys.stderr)
            continue
        snaps = [(snapshot_progress(s), s) for s in sorted((run / "snapshots").glob("ck_*"))
                 if (s / "trainer_state.pt").is_file()]
        for budget in budgets:
            within = [(p, s) for p, s in snaps if 0.8 * budget <= p["tokens"] <= 1.25 * budget]
            if not within:
                print(f"{run}: no snapshot within 0.8-1.25x of {budget} tokens", file=sys.stderr)
                continue
            progress, snap = min(within, key=lambda ps: abs(ps[0]["tokens"] - budget))
            point = root / "points" / f"{run.name}_{int(progress['tokens'])}"
            if not point.exists():
                tmp = point.with_name(point.name + ".tmp")
                shutil.rmtree(tmp, ignore_errors=True)
                (tmp / "checkpoints").mkdir(parents=True)
                for name in ("resolved_config.yaml", "summary.json"):
                    shutil.copy2(run / name, tmp / name)
                shutil.copytree(snap, tmp / "checkpoints" / "best", ignore=shutil.ignore_patterns("trainer_state.pt"))
                (tmp / "point.json").write_text(json.dumps({
                    "run": str(run), "seed": int(run.name.split("_")[1]), "budget": budget, "step": progress["step"],
                    "tokens": progress["tokens"], "snapshot": snap.name}, indent=1))
                tmp.rename(point)
            made.append(point)
    return made


def points(root: Path) -> list[Path]:
    found = (root / "points").glob("seed_*[0-9]")
    return sorted(found, key=lambda p: (p.name.split("_")[1], int(p.name.split("_")[2])))


def rows(root: Path) -> list[dict]:
    out, ngram = [], None
    for point in points(root):
        report = point / REPORT
        if not report.is_file():
            continue
        r, meta = json.loads(report.read_text()), json.loads((point / "point.json").read_text())
        out.append({"kind": "eagle3", "seed": meta["seed"], "step": meta["step"], "tokens": int(meta["tokens"]),
                    "k": r["k"], "accept_len": r["accept_len"], "accept_len_se": r.get("accept_len_se"),
                    "harness_accept_len": (r.get("harness") or {}).get("accept_len"),
                    "tokens_per_s": r.get("tokens_per_s"), "speedup": r.get("speedup"),
                    "implausible": "; ".join(r.get("implausible") or [])})
        ngram = ngram or r.get("ngram")
        plain = r.get("plain_tokens_per_s")
    if out:
        if ngram:
            out.append({"kind": "ngram", "seed": "", "step": "", "tokens": "", "k": ngram.get("k", 3),
                        "accept_len": ngram["accept_len"], "accept_len_se": ngram.get("accept_len_se"),
                        "harness_accept_len": "", "tokens_per_s": ngram.get("tokens_per_s"),
                        "speedup": ngram.get("speedup"), "implausible": ""})
        out.append({"kind": "plain", "seed": "", "step": "", "tokens": "", "k": 0, "accept_len": 1.0,
                    "accept_len_se": 0.0, "harness_accept_len": "", "tokens_per_s": plain, "speedup": 1.0,
                    "implausible": ""})
    return out


def fmt(x, spec=".4f"):
    return "-" if x in (None, "") else format(x, spec)


def report(root: Path, png: Path | None, csv_path: Path | None) -> None:
    table = rows(root)
    if not table:
        raise SystemExit(f"{root}: no point has a {REPORT} yet")
    print("| kind | seed | step | tokens trained | vLLM accept_len (k=3, T=0) | ± se | harness | tokens/s | speedup |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        print(f"| {r['kind']} | {r['seed']} | {r['step']} | {r['tokens']} | {fmt(r['accept_len'])} | "
              f"{fmt(r['accept_len_se'])} | {fmt(r['harness_accept_len'])} | {fmt(r['tokens_per_s'], '.1f')} | "
              f"{fmt(r['speedup'], '.3f')}{' (implausible)' if r['implausible'] else ''} |")
    if csv_path:
        with csv_path.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(table[0]))
            writer.writeheader()
            writer.writerows(table)
    if png:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for seed in sorted({r["seed"] for r in table if r["kind"] == "eagle3"}):
            pts = [r for r in table if r["kind"] == "eagle3" and r["seed"] == seed]
            ax.errorbar([r["tokens"] for r in pts], [r["accept_len"] for r in pts],
                        yerr=[r["accept_len_se"] or 0 for r in pts], marker="o", capsize=3,
                        label=f"EAGLE-3 drafter, seed {seed}")
        for r in table:
            if r["kind"] == "ngram":
                ax.axhline(r["accept_len"], color="tab:red", ls="--", label=f"vLLM n-gram {r['accept_len']:.3f}")
            if r["kind"] == "plain":
                ax.axhline(1.0, color="gray", ls=":", label="plain decoding (1 token per step)")
        ax.set_xscale("log")
        ax.set_xlabel("tokens trained")
        ax.set_ylabel("accept_len (tokens per verify step, k=3, T=0)")
        ax.set_title("SmolLM2-135M-Instruct EAGLE-3 drafter on ShareGPT, vLLM-CPU, 32 held-out prompts")
        ax.title.set_fontsize(9)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(png, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["points", "unmeasured", "report"])
    p.add_argument("dir", type=Path)
    p.add_argument("--budgets", type=int, nargs="+", default=[50_000, 100_000, 200_000, 500_000, 1_000_000])
    p.add_argument("--png", type=Path)
    p.add_argument("--csv", type=Path)
    args = p.parse_args(argv)
    if args.what == "points":
        for point in make_points(args.dir, args.budgets):
            print(point)
    elif args.what == "unmeasured":
        for point in points(args.dir):
            if not (point / REPORT).is_file():
                print(point)
    else:
        report(args.dir, args.png, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
