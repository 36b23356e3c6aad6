"""How long the launcher takes: `python launch.py --cfg job`, and `python launch.py` to its first training step.

    python bench/startup.py [--reps 5]

The second is measured with the dataset cache warm (the first run builds it and is not counted): from the
process start until metrics.jsonl holds its first train row (logger.log_every=1), so it includes imports,
composition, the run dir, data loaders, the draft's construction and the step-0 evaluation.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cfg_job() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "launch.py"), "--cfg", "job"], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def first_step(run_dir: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), f"hydra.run.dir={run_dir}",
                             "logger.mode=disabled", "logger.log_every=1", "optim.max_steps=2"], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    metrics = run_dir / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and any(json.loads(line)["split"] == "train" for line in metrics.read_text().splitlines()):
            elapsed = time.perf_counter() - start
            proc.wait()
            return elapsed
        time.sleep(0.02)
    raise SystemExit(f"launch.py exited with {proc.returncode} before its first step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    with tempfile.TemporaryDirectory() as tmp:
        first_step(Path(tmp) / "warm")  # builds or finds the verifier and dataset cache
        cfg = [cfg_job() for _ in range(args.reps)]
        steps = [first_step(Path(tmp) / f"run{i}") for i in range(args.reps)]
    print(f"python launch.py --cfg job:               median {statistics.median(cfg):.2f} s "
          f"(min {min(cfg):.2f}, max {max(cfg):.2f}, {args.reps} runs)")
    print(f"python launch.py to first step (warm):    median {statistics.median(steps):.2f} s "
          f"(min {min(steps):.2f}, max {max(steps):.2f}, {args.reps} runs)")


if __name__ == "__main__":
    main()
