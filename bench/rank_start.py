"""What starting the ranks costs: two consecutive 2-rank launches of the tiny default (DDP on gloo, 12 steps of the
tests' small data) in one process, their ranks spawned or forked from the forkserver (eagle3/run/elastic.py).

    python bench/rank_start.py

Each start method runs in a fresh process of its own, after the verifier and data are built (not counted): the
wall time of each launch, and the CPU time (user+sys) of that process and everything it started (the ranks, the
forkserver) over both launches. Prints spawn / forkserver ratios.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from common import ROOT, tiny_run_config

OVERRIDES = ["distributed=ddp", "distributed.nproc_per_node=2", "distributed.backend=gloo", "logger.log_every=1",
             "optim.max_steps=12", "data.synth.num_samples=128", "data.synth.response_len=48",
             "data.total_seq_len=512"]


def run_config(run_dir: Path):
    cfg = tiny_run_config(OVERRIDES)
    run_dir.mkdir(parents=True)
    return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, dir=str(run_dir)))


def launches(method: str, out: Path) -> dict:
    """Two launches in this process with `method` ("spawn" or "forkserver"): their walls and the CPU seconds."""
    import torch.distributed.launcher.api as launcher_api

    from eagle3.run import elastic
    from eagle3.run.inputs import materialize_inputs

    patches = []
    if method == "spawn":  # as eagle3.run.elastic started the ranks before the forkserver
        real = launcher_api.LaunchConfig
        patches = [mock.patch.object(launcher_api, "LaunchConfig",
                                     lambda **kw: real(**{**kw, "start_method": "spawn"})),
                   mock.patch.object(elastic, "ensure_forkserver", lambda: None)]
    walls = []
    for p in patches:
        p.start()
    for i in range(2):
        cfg = run_config(out / f"run{i}")
        verifier_dir, data_dir = materialize_inputs(cfg)
        start = time.perf_counter()
        elastic.run_job(cfg, verifier_dir, data_dir)
        walls.append(time.perf_counter() - start)
    elastic.stop_forkserver()  # reaped: its CPU (and its ranks') is counted as this process's children's
    cpu = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for f in ("ru_utime", "ru_stime"))
    return {"walls": walls, "cpu": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", choices=["spawn", "forkserver"], help="(internal) one method, in this process")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    os.environ.setdefault("WANDB_SILENT", "true")
    if args.method:
        print(json.dumps(launches(args.method, args.out)))
        return
    from eagle3.run.inputs import materialize_inputs

    with tempfile.TemporaryDirectory() as tmp:
        materialize_inputs(run_config(Path(tmp) / "warm"))
        results = {}
        for method in ("spawn", "forkserver"):
            proc = subprocess.run([sys.executable, __file__, "--method", method, "--out", f"{tmp}/{method}"],
                                  cwd=ROOT, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{method}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
            results[method] = json.loads(proc.stdout.strip().splitlines()[-1])
    for method, r in results.items():
        print(f"{method:>10}: launch 1 {r['walls'][0]:6.1f} s, launch 2 {r['walls'][1]:6.1f} s wall; "
              f"{r['cpu']:6.1f} CPU-s (user+sys) for both")
    s, f = results["spawn"], results["forkserver"]
    print(f"spawn / forkserver: launch 1 wall {s['walls'][0] / f['walls'][0]:.2f}x, launch 2 wall "
          f"{s['walls'][1] / f['walls'][1]:.2f}x, CPU {s['cpu'] / f['cpu']:.2f}x "
          f"({os.cpu_count()} cores, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')})")


if __name__ == "__main__":
    main()
