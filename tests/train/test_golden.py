"""Golden values: the tiny default (`python launch.py`, the README's run) for one of its three epochs
(`optim.epochs=1`: its schedule then ends at step 58) gives the same val loss and tau_sim at every val pass as when
they were recorded, so a change of model, loss, data or schedule shows up as a failing
test, and a speculators or torch upgrade as one to update on purpose."""

from __future__ import annotations

import pytest

from commands import launch
from factories import read_rows

# step -> (val loss, val tau_sim) of `python launch.py optim.epochs=1` (58 steps), on one torch thread.
# Recorded on torch 2.14.1 (CPU), speculators 0.9.0. To regenerate after an intended change: run
# `OMP_NUM_THREADS=1 python launch.py optim.epochs=1 hydra.run.dir=/tmp/golden`, then copy each val row's "loss"
# and "tau_sim" from /tmp/golden/metrics.jsonl here, and say in the commit what changed them. One epoch since the
# full tier's time went over its budget: the three epochs' values (174 steps; 18.80 and 1.8025 at the end) moved with
# every change these move with, and the epochs' packing draws are checked by tests/formats/test_packing.py.
TINY_DEFAULT_VAL = {
    0: (74.12174298213078, 1.0212912087912087),
    58: (36.89975929260254, 1.5575206043956045),
}
# Same torch, other machine or thread count: float sums in another order move the loss by about 1e-6 relative
# and can flip a near-tied argmax, each flip moving tau_sim by 1/5824 (the val split's positions). A change of
# model, loss or data moves the loss by percents.
LOSS_REL, TAU_ABS = 1e-3, 3e-3


@pytest.mark.slow
def test_tiny_default_matches_its_golden_values(cache_dir, tmp_path):
    run_dir = tmp_path / "default"
    proc = launch([f"hydra.run.dir={run_dir}", "logger.mode=disabled", "optim.epochs=1"], cache_dir, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val = {r["step"]: (r["loss"], r["tau_sim"]) for r in read_rows(run_dir) if r["split"] == "val"}
    assert sorted(val) == sorted(TINY_DEFAULT_VAL)
    for step, (loss, tau) in TINY_DEFAULT_VAL.items():
        assert val[step][0] == pytest.approx(loss, rel=LOSS_REL), f"val loss at step {step}"
        assert val[step][1] == pytest.approx(tau, abs=TAU_ABS), f"val tau_sim at step {step}"
