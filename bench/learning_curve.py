"""The learning curve of docs/learning_curve.sh: its measurement points and its report.

    python bench/learning_curve.py points DIR --budgets 50000 100000 ...   # a run dir per (seed, budget)
    python bench/learning_curve.py unmeasured DIR                          # the points with no vLLM report yet
    python bench/learning_curve.py report DIR [--png P] [--csv C]          # table (stdout), CSV and picture
    python bench/learning_curve.py snapshot RUN [--name ck_final]          # RUN/checkpoints/last kept in snapshots/

DIR holds one training run per seed (`seed_<s>/`, with `snapshots/ck_*`: copies of checkpoints/last at each save).
A point is `DIR/points/seed_<s>_<tokens>/`: the run's resolved_config.yaml and summary.json, and as
checkpoints/best the snapshot whose trained tokens (its trainer_state.pt) are nearest the budget, which is what
`python -m eagle3.serve` measures. The report reads each point's serve_vllm_k3_t0.json (accept_len, its standard
error, tokens/s, speedup) and the first report's n-gram block; the CSV has a row per measured point and one each for
n-gram and plain.

Every write goes through eagle3.safe_write: a symlink at DIR/points, RUN/snapshots, a point or snapshot, or the
PNG and CSV is refused (nothing is written through it), and a point or snapshot appears whole or not at all.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
import time
from pathlib import Path

from common import ROOT  # noqa: F401  (puts the repository on sys.path)

from eagle3.errors import UserError
from eagle3.safe_write import replace_dir, replace_file, write_text

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
            if point.is_symlink() or not point.exists():  # a link there is refused by replace_dir
                meta = {"run": str(run), "seed": int(run.name.split("_")[1]), "budget": budget,
                        "step": progress["step"], "tokens": progress["tokens"], "snapshot": snap.name}
                replace_dir(root, point, lambda tmp, r=run, s=snap, m=meta: build_point(tmp, r, s, m),
                            point.with_name(point.name + ".tmp"), point.with_name(point.name + ".old"))
            made.append(point)
    return made


def build_point(tmp: Path, run: Path, snapshot: Path, meta: dict) -> None:
    """A point's dir, built in the fresh dir `tmp`: the run's records and the snapshot as checkpoints/best."""
    (tmp / "checkpoints").mkdir(parents=True)
    for name in ("resolved_config.yaml", "summary.json"):
        shutil.copy2(run / name, tmp / name)
    shutil.copytree(snapshot, tmp / "checkpoints" / "best", ignore=shutil.ignore_patterns("trainer_state.pt"))
    write_text(tmp, tmp / "point.json", json.dumps(meta, indent=1))


def snapshot(run: Path, name: str | None = None) -> Path | None:
    """A copy of RUN/checkpoints/last as RUN/snapshots/<name> (default ck_<unix time>), whole or not at all; None
    when there is no checkpoints/last yet or the name is taken (a snapshot is never overwritten)."""
    last = run / "checkpoints" / "last"
    target = run / "snapshots" / (name or f"ck_{int(time.time())}")
    if not last.is_dir() or (target.exists() and not target.is_symlink()):
        return None
    replace_dir(run, target, lambda tmp: shutil.copytree(last, tmp), target.with_name(f".tmp_{target.name}"),
                target.with_name(f".old_{target.name}"))
    return target


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
        def write_csv(tmp: Path) -> None:
            with tmp.open("x", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(table[0]))
                writer.writeheader()
                writer.writerows(table)

        replace_file(csv_path.parent, csv_path, write_csv)
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
        replace_file(png.parent, png, lambda tmp: fig.savefig(tmp, dpi=110, format="png"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["points", "unmeasured", "report", "snapshot"])
    p.add_argument("dir", type=Path, help="the curve's dir; snapshot: a run dir")
    p.add_argument("--name", help="snapshot: the snapshot's name (default ck_<unix time>)")
    p.add_argument("--budgets", type=int, nargs="+", default=[50_000, 100_000, 200_000, 500_000, 1_000_000])
    p.add_argument("--png", type=Path)
    p.add_argument("--csv", type=Path)
    args = p.parse_args(argv)
    try:
        run(args)
    except UserError as e:  # a link refused, with what it names
        raise SystemExit(f"error: {e}") from None
    return 0


def run(args: argparse.Namespace) -> None:
    if args.what == "points":
        for point in make_points(args.dir, args.budgets):
            print(point)
    elif args.what == "unmeasured":
        for point in points(args.dir):
            if not (point / REPORT).is_file():
                print(point)
    elif args.what == "snapshot":
        made = snapshot(args.dir, args.name)
        if made:
            print(made)
    else:
        report(args.dir, args.png, args.csv)


if __name__ == "__main__":
    sys.exit(main())
