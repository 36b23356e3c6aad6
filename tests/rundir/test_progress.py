"""The loop's progress and the run summary: typed records stored as plain dicts (trainer_state.pt, summary.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from eagle3.errors import CheckpointError
from eagle3.rundir.progress import Progress, RunSummary

ROW0 = {"step": 0, "split": "val", "epoch": 0, "loss": 73.5, "full_acc_0": 0.01, "tau_sim": 1.02}
ROW9 = {"step": 9, "split": "val", "epoch": 1, "loss": 17.4, "full_acc_0": 0.36, "tau_sim": 1.87}
# summary.json's keys as eagle3.sweep.compare and eagle3.eval.accept read them, in the order they are written.
SUMMARY_KEYS = ["steps", "tokens", "tokens_per_s", "train_wall_s", "step0", "final", "best", "checkpoints",
                "verifier_dir", "data_dir", "device", "world_size", "provenance", "wall_s", "phases_s"]


def test_progress_round_trips_through_a_weights_only_trainer_state(tmp_path):
    progress = Progress(step=9, epoch=1, step_in_epoch=0, tokens=1234.0, train_wall_s=2.5, skipped_steps=1,
                        step0=ROW0, best=ROW9, final=ROW9)
    torch.save({"progress": progress.as_dict()}, tmp_path / "trainer_state.pt")
    saved = torch.load(tmp_path / "trainer_state.pt", weights_only=True)["progress"]
    assert Progress.from_dict(saved, tmp_path) == progress


def test_progress_of_another_version_is_refused_not_patched(tmp_path):
    old = Progress(step0=ROW0, best=ROW0, final=ROW0).as_dict()
    del old["skipped_steps"]  # saved before skipped steps were counted
    with pytest.raises(CheckpointError, match="skipped_steps"):
        Progress.from_dict(old, tmp_path)


def test_summary_keeps_its_keys_and_values(tmp_path):
    progress = Progress(step=9, tokens=1000.0, train_wall_s=4.0, step0=ROW0, best=ROW9, final=ROW9)
    summary = RunSummary.of(progress, Path("/v"), Path("/d"), "cpu", 2)
    written = json.loads(json.dumps(summary.to_dict()))
    assert list(written) == SUMMARY_KEYS
    assert written["tokens_per_s"] == 250.0 and written["best"] == ROW9 and written["world_size"] == 2
    assert written["checkpoints"] == {"last": "checkpoints/last", "best": "checkpoints/best"}  # in the run dir
    assert RunSummary(**written) == summary
    probe = RunSummary.of(Progress(step0=ROW0, best=ROW0, final=ROW0), Path("/v"), Path("/d"), "cpu", 1)
    assert probe.tokens_per_s is None  # optim.max_steps=0: no training step ran


def test_the_job_clock_times_its_phases_once_and_puts_the_rest_in_other():
    import time

    from eagle3.rundir.progress import JobClock

    clock = JobClock(time.time() - 10.0)  # a job that started 10 s ago
    with clock.phase("val passes"):
        with clock.phase("saves"):  # inside another phase: counted in the outer one only
            pass
    clock.loop_starts()
    phases = clock.by_phase()
    assert list(phases) == [*JobClock.PHASES, "other"]
    assert phases["saves"] == 0.0 and phases["start-up"] >= 9.9 and all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(clock.wall(), abs=0.05)
