"""Each stage of docs/learning_curve.sh's path from conversations to a trained drafter: its tokens/s and its share of
this machine's counted roofline.

    python bench/pipeline.py OUT_DIR [--seed 0]

OUT_DIR is the script's (times.txt, data/, seed_<s>/). The roofline of a stage is its FLOP per token (counted by the
project's plan, `python launch.py ... plan=true`: the verifier's forward, the draft's step) at the matrix-multiply
rates the plan measured on this machine at the step's shapes (its own roofline cache, both threads); a stage's share
is measured tokens/s over that (the hidden states' FLOP leave out the verifier's lm_head, which extraction does not
run). Stages:
  hidden states   vLLM's extract_hidden_states over the dataset (tokens in the dataset / the stage's wall time,
                  the engine's start included)
  training        the run's trained tokens / its seconds in the loop (summary.json), packing's empty slots
                  counted against it (a step's FLOP are those of total_seq_len tokens)
  packing fill    trained tokens / (steps x total_seq_len)
  val passes      share of the run's wall time (summary.json's phases_s)
  whole path      tokens trained / (hidden states + the run's wall time), against the two rooflines in series
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def stamps(times: Path) -> dict[str, dt.datetime]:
    """times.txt's first stamp of each label."""
    out: dict[str, dt.datetime] = {}
    for line in times.read_text().splitlines():
        when, _, label = line.partition(" ")
        out.setdefault(label, dt.datetime.fromisoformat(when.replace("Z", "+00:00")))
    return out


def plan_rates(run: Path, rows_file: Path) -> dict[str, float]:
    """{'step_s', 'flops', 'verifier_flops', 'tokens_per_step'} of the run's config as plan=true counts it, and
    the same config with data=online for the verifier's forward."""
    import yaml

    cfg = yaml.safe_load((run / "resolved_config.yaml").read_text())
    data = cfg["data"]
    base = ["model=auto", f"model.verifier.path={cfg['model']['verifier']['path']}",
            f"model.draft.draft_vocab_size={cfg['model']['draft']['draft_vocab_size']}",
            f"data.total_seq_len={data['total_seq_len']}", "plan=true", "logger.mode=disabled"]
    out = subprocess.run([sys.executable, "launch.py", *base, "data=online", f"data.path={rows_file}"],
                         cwd=ROOT, capture_output=True, text=True)
    text = out.stdout + out.stderr
    step = re.search(r"step time: about ([\d.]+) s \(([\d.]+) TFLOP per rank, ([\d.]+) TFLOP/s", text)
    verifier = re.search(r"of which the verifier's forward \(data=online\): ([\d.]+) TFLOP", text)
    if not step or not verifier:
        raise SystemExit(f"plan=true did not print a step time:\n{text[-2000:]}")
    return {"rate": float(step.group(3)) * 1e12, "flops": float(step.group(2)) * 1e12,
            "verifier_flops": float(verifier.group(1)) * 1e12, "tokens_per_step": data["total_seq_len"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    root, run = args.dir, args.dir / f"seed_{args.seed}"
    t = stamps(root / "times.txt")
    summary = json.loads((run / "summary.json").read_text())
    plan = plan_rates(run, root / "held_out.json")

    from datasets import load_from_disk

    rows = load_from_disk(str(root / "data"))
    dataset_tokens = int(sum(rows["seq_len"]))
    hs_s = (t["hidden states done"] - t["hidden states (vLLM)"]).total_seconds()
    seq = plan["tokens_per_step"]
    # the plan's verifier forward includes the lm_head (data=online computes the targets' logits); extraction
    # computes hidden states only
    verifier_cfg = json.loads((Path(summary["verifier_dir"]) / "config.json").read_text())
    lm_head = 2 * verifier_cfg["hidden_size"] * verifier_cfg["vocab_size"]
    verifier_per_token = plan["verifier_flops"] / (seq + 1) - lm_head
    draft_per_token = (plan["flops"] - plan["verifier_flops"]) / seq
    trained, loop_s, steps = summary["tokens"], summary["train_wall_s"], summary["steps"]
    phases = summary.get("phases_s") or {}
    val_s = phases.get("val passes", 0.0)
    roof_hs, roof_train = plan["rate"] / verifier_per_token, plan["rate"] / draft_per_token
    fill = trained / (steps * seq)
    whole_s = hs_s * trained / dataset_tokens + summary["wall_s"]
    roof_whole = 1 / (1 / roof_hs + 1 / (roof_train * fill))
    print(f"matmul rate at the step's shapes (plan=true, this machine): {plan['rate'] / 1e9:.0f} GFLOP/s; "
          f"verifier forward {verifier_per_token / 1e9:.3f} GFLOP/token, draft step {draft_per_token / 1e9:.3f}")
    print(f"{'stage':<16}{'tokens/s':>10}{'roofline':>10}{'share':>8}  detail")
    print(f"{'hidden states':<16}{dataset_tokens / hs_s:>10.0f}{roof_hs:>10.0f}{dataset_tokens / hs_s / roof_hs:>8.0%}"
          f"  {dataset_tokens:,} tokens in {hs_s / 60:.1f} min (engine start included)")
    print(f"{'training':<16}{trained / loop_s:>10.0f}{roof_train:>10.0f}{trained / loop_s / roof_train:>8.0%}"
          f"  {trained:,.0f} tokens, {steps} steps of {seq} in {loop_s / 60:.1f} min in the loop")
    print(f"{'packing fill':<16}{'':>10}{'':>10}{fill:>8.0%}  tokens / (steps x {seq})")
    print(f"{'val passes':<16}{'':>10}{'':>10}{val_s / summary['wall_s']:>8.0%}  {val_s / 60:.1f} min of the run's "
          f"{summary['wall_s'] / 60:.1f}")
    print(f"{'whole path':<16}{trained / whole_s:>10.0f}{roof_whole:>10.0f}{trained / whole_s / roof_whole:>8.0%}"
          f"  {trained:,.0f} tokens: hidden states for them + the run, {whole_s / 60:.1f} min "
          f"(1M tokens: {1e6 / (trained / whole_s) / 60:.0f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
