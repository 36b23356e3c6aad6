"""Optuna studies that cannot run as asked are refused before the first trial, one study command runs in a sweep
dir at a time, and a signal leaves the study and the sweep index agreeing (a stopped trial resumed to its end is
COMPLETE in the study)."""

from __future__ import annotations

import fcntl
import json
import os
import signal
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf
from test_search import LR, SHORT, index_jobs, load_study, run_dirs, study_command

from commands import launch, sigterm_in_process_after_step_1


def refused(proc, *words: str) -> None:
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for word in words:
        assert word in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("wrong", [["objective=accept_len"], ["optim.lrr=interval(1e-3, 1e-2)"],
                                   ["+hydra.sweeper.params={optim.lrr:'interval(1e-3, 1e-2)'}"]])
def test_what_every_trial_would_fail_on_is_refused_before_the_study_opens(wrong, cache_dir, tmp_path):
    # The last form: the search space given as +hydra.sweeper.params on the command line reaches the sweeper.
    sweep = tmp_path / "study"
    proc = launch(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", LR, *SHORT, *wrong,
                   f"hydra.sweep.dir={sweep}"], cache_dir, timeout=300)
    refused(proc, "nothing was added to the study", "objective" if wrong == ["objective=accept_len"] else "lrr")
    assert not (sweep / "study.db").exists() and not (sweep.exists() and run_dirs(sweep))


@pytest.mark.slow
def test_search_space_from_the_command_line_params_is_sampled(cache_dir, tmp_path):
    sweep = tmp_path / "study"
    space = "hydra.sweeper.params={optim.lr:'tag(log, interval(1e-3, 1e-2))'}"
    command = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", *SHORT, f"hydra.sweep.dir={sweep}"]
    # Without +, Hydra's own one message (its config is struct): how to add the keys.
    refused(launch([*command, space], cache_dir, timeout=300), "+hydra.sweeper.params")
    proc = launch([*command, f"+{space}"], cache_dir, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (trial,) = load_study(sweep).get_trials()
    assert trial.state.name == "COMPLETE" and 1e-3 <= trial.params["optim.lr"] <= 1e-2


@pytest.mark.slow
def test_a_second_study_command_in_the_same_sweep_dir_is_refused(cache_dir, tmp_path):
    sweep = tmp_path / "study"
    sweep.mkdir()
    with open(sweep / "study.lock", "a") as lock:  # what the first command holds while it runs
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = launch(study_command(sweep, 2), cache_dir, timeout=300)
    refused(proc, "in use by another hydra/sweeper=optuna command", "nothing was added")
    assert not (sweep / "study.db").exists()


class SignalledLauncher:
    """Completes the first batch; on the second, a SIGTERM arrives before the trial's run handles signals."""

    def __init__(self, sweep: Path) -> None:
        self.sweep, self.calls = sweep, 0

    def launch(self, batch, initial_job_idx):
        self.calls += 1
        if self.calls == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        result = JobReturn(overrides=batch[0], status=JobStatus.COMPLETED, _return_value=1.5)
        result.hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": str(self.sweep / "0")}}})
        return [result]


def test_sigterm_between_trials_exits_128_plus_signal_and_records_the_trial_that_did_not_run(tmp_path, monkeypatch):
    import optuna

    from hydra_plugins.eagle3_optuna_sweeper.optuna_sweeper import OptunaSweeper, stop_between_trials
    from hydra_plugins.eagle3_optuna_sweeper.search_space import parse_search_space

    sweeper = OptunaSweeper(n_trials=3, n_jobs=1, direction="maximize", seed=0, n_startup_trials=5,
                            study_name="eagle3", storage=None, params=None)
    sweeper.launcher = SignalledLauncher(tmp_path)
    monkeypatch.setattr(sweeper, "validate_batch_is_legal", lambda batch: None)
    space, fixed = parse_search_space([LR, "optim.max_steps=4"])
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="eagle3",
                                direction="maximize")
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped, stop_between_trials():
        sweeper._run_trials(study, space, fixed, tmp_path)
    assert stopped.value.code == 128 + signal.SIGTERM and signal.getsignal(signal.SIGTERM) is before
    assert [(t.number, t.state.name) for t in study.get_trials()] == [(0, "COMPLETE"), (1, "FAIL")]
    (entry,) = index_jobs(tmp_path)
    assert entry["num"] == 1 and entry["status"] == "interrupted" and "optim.max_steps=4" in entry["overrides"]


@pytest.mark.slow
def test_a_stopped_trial_resumed_to_its_end_is_complete_in_the_study(cache_dir, tmp_path):
    sweep = tmp_path / "study"
    stopped = sigterm_in_process_after_step_1(study_command(sweep, 2, "optim.max_steps=6"), cache_dir)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    jobs = index_jobs(sweep)
    assert [(j["num"], j["status"]) for j in jobs] == [(0, "stopped")], jobs
    assert [t.state.name for t in load_study(sweep).get_trials()] == ["RUNNING"]

    run = Path(jobs[0]["run_dir"])
    proc = launch([f"resume='{run}'"], cache_dir, timeout=900)  # Hydra quotes: the dir name holds '='
    assert proc.returncode == 0, proc.stderr[-3000:]
    (trial,) = load_study(sweep).get_trials()
    assert trial.state.name == "COMPLETE"
    assert trial.value == json.loads((run / "summary.json").read_text())["best"]["tau_sim"]
    assert [(j["num"], j["status"]) for j in index_jobs(sweep)] == [(0, "completed")]


@pytest.mark.slow
def test_the_default_sweeper_takes_its_params_from_the_command_line(cache_dir, tmp_path):
    # Both sweep values are refused by the sweeper's check of every job: they reached it.
    proc = launch(["-m", "+hydra.sweeper.params={optim.lr:'-1,-2'}", *SHORT, f"hydra.sweep.dir={tmp_path / 's'}"],
                  cache_dir, timeout=300)
    refused(proc, "2 of 2 sweep jobs have an invalid config", "optim.lr=-1", "optim.lr=-2")
