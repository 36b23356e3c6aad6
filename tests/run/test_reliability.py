"""Bad input, faults and interruptions: one clear message, nothing lost, nothing untrusted run."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from commands import launch, sigterm_after_first_train_row
from factories import ROOT, SMALL_DATA, read_rows, small_run, typed_run_config


def poison(model, nan_calls: set[int]):
    """Makes the loss NaN on the chosen training forward calls (1-based)."""
    original, calls = model.forward, {"n": 0}

    def forward(*args, **kwargs):
        tokens, loss, metrics = original(*args, **kwargs)
        if model.training:
            calls["n"] += 1
            if calls["n"] in nan_calls:
                loss = loss * float("nan")
        return tokens, loss, metrics
    model.forward = forward


def train_poisoned(cache_dir, run_dir, nan_calls, overrides):
    from eagle3.train.loop import Training, train
    from eagle3.train.track import Tracker

    cfg, model, loaders = small_run(cache_dir, run_dir, ["logger.log_every=1", *overrides])
    poison(model, nan_calls)
    with Tracker(run_dir, cfg.logger, cfg.run) as tracker:
        return train(Training(model, loaders, cfg, tracker))


@pytest.mark.slow
def test_non_finite_steps_are_skipped_and_counted(cache_dir, tmp_path):
    progress = train_poisoned(cache_dir, tmp_path / "run", {3, 5}, ["optim.max_steps=8"])
    assert progress.step == 8 and progress.skipped_steps == 2
    rows = [r for r in read_rows(tmp_path / "run") if r["split"] == "train"]
    assert rows[-1]["skipped_steps"] == 2
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    assert torch.isfinite(torch.tensor(progress.final["loss"]))


@pytest.mark.slow
def test_too_many_in_a_row_stop_with_a_loadable_last(cache_dir, tmp_path):
    from eagle3.init.checkpoint import load_draft, load_trainer_state
    from eagle3.train.loop import RunStopped

    run_dir = tmp_path / "run"
    with pytest.raises(RunStopped, match="3 optimizer steps in a row"):
        train_poisoned(cache_dir, run_dir, set(range(4, 100)), ["optim.max_steps=20", "optim.max_skipped_steps=3"])
    last = run_dir / "checkpoints" / "last"
    assert load_trainer_state(last)["progress"]["step"] == 6
    model = load_draft(last, attn_impl="sdpa")
    assert all(torch.isfinite(p).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_that_resume_continues(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    args = [f"hydra.run.dir={run_dir}", "optim.epochs=1", "logger.log_every=1", "logger.mode=disabled", *SMALL_DATA]
    returncode, out = sigterm_after_first_train_row(args, cache_dir, run_dir)
    assert returncode == 128 + signal.SIGTERM, out[-2000:]
    assert f"resume={run_dir}" in out
    from eagle3.init.checkpoint import load_trainer_state

    stopped_at = load_trainer_state(run_dir / "checkpoints" / "last")["progress"]["step"]
    assert 0 < stopped_at < 15  # an epoch of SMALL_DATA: 15 steps
    resumed = launch([f"resume={run_dir}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 15


def test_a_pickle_offered_as_weights_is_refused_and_never_run(tmp_path):
    from eagle3.init.files import CheckpointError, checkpoint_files

    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "pytorch_model.bin").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(CheckpointError, match="pickle files are never loaded"):
        checkpoint_files(ckpt, "init.path")
    (ckpt / "model.safetensors").write_bytes(pickle.dumps(Payload()))  # pickle bytes under a safetensors name
    from eagle3.init.files import tensor_shapes

    with pytest.raises(CheckpointError, match="not a safetensors file"):
        tensor_shapes(checkpoint_files(ckpt, "init.path"))
    assert not marker.exists()


MALFORMED = [
    (["optim.lr=abc"], "optim.lr"), (["optim.lr=-1"], "optim.lr"), (["optim.lr=0"], "optim.lr"),
    (["optim.lrr=1"], "optim.lrr"), (["optim.warmup_ratio=2"], "optim.warmup_ratio"),
    (["optim.warmup_ratio=-0.1"], "optim.warmup_ratio"), (["optim.epochs=0"], "optim.epochs"),
    (["optim.epochs=1.5"], "optim.epochs"), (["optim.max_steps=-3"], "optim.max_steps"),
    (["optim.grad_clip=0"], "optim.grad_clip"), (["optim.weight_decay=-1"], "optim.weight_decay"),
    (["optim.betas=[0.9]"], "optim.betas"), (["optim.betas=[0.9,1.5]"], "optim.betas"),
    (["optim.scheduler=step"], "optim.scheduler"), (["optim.grad_accum=0"], "optim.grad_accum"),
    (["optim.checkpoint_every=0"], "optim.checkpoint_every"), (["optim.eval_every=-1"], "optim.eval_every"),
    (["optim.max_skipped_steps=0"], "optim.max_skipped_steps"), (["init=nope"], "init"), (["model=nope"], "model"),
    (["data.train_ratio=1.5"], "data.train_ratio"), (["data.train_ratio=0"], "data.train_ratio"),
    (["data.total_seq_len=0"], "data.total_seq_len"), (["data=offline", "data.path=/missing"], "data.path"),
    (["data=offline"], "data.path"), (["model.draft.draft_vocab_size=999999"], "model.draft.draft_vocab_size"),
    (["model.draft.ttt_steps=0"], "model.draft.ttt_steps"), (["model.draft.attn_impl=flash"], "model.draft.attn_impl"),
    (["device=tpu"], "device"), (["distributed.nproc_per_node=0"], "distributed.nproc_per_node"),
    (["distributed=multinode", "distributed.node_rank=5", "distributed.rdzv_endpoint=h:1"], "distributed.node_rank"),
    (["distributed.backend=mpi"], "distributed.backend"), (["logger.mode=sometimes"], "logger.mode"),
    (["seed=abc"], "seed"), (["model.verifier.path=/nope"], "model.verifier"), (["resume=/nope"], "resume"),
    (["init=pretrained"], "init.path"),
]


# One of each kind of mistake (a value of the wrong type, a misspelt key, a range, an unknown option, a missing
# required value, a path that does not exist) runs in the fast tier; each is a launch.py process of its own
# (1-3 s on 2 busy cores), so the rest of the 37 run in the full tier.
FAST_MALFORMED = {"optim.lr=abc", "optim.lrr=1", "optim.warmup_ratio=2", "init=nope", "data=offline",
                  "model.verifier.path=/nope", "resume=/nope"}


@pytest.mark.parametrize("overrides,key", [
    pytest.param(o, k, id=" ".join(o), marks=() if " ".join(o) in FAST_MALFORMED else pytest.mark.slow)
    for o, k in MALFORMED])
def test_malformed_override_is_one_message_naming_the_key(overrides, key, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch([*overrides, f"hydra.run.dir={run_dir}"], tmp_path / "cache", timeout=120)
    assert proc.returncode != 0
    assert key in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) < 25, proc.stderr
    assert not run_dir.exists()  # not even the .hydra/ of a refused config


@pytest.mark.slow
def test_a_run_dir_without_room_for_two_checkpoints_is_refused(cache_dir, tmp_path, monkeypatch):
    import shutil as shutil_module

    from eagle3.config import ConfigError
    from eagle3.init.checkpoint import check_disk

    _, model, _ = small_run(cache_dir, tmp_path / "run", [])
    check_disk(tmp_path, model)  # this machine has room
    monkeypatch.setattr(shutil_module, "disk_usage", lambda _: shutil_module._ntuple_diskusage(10**9, 10**9, 10**5))
    with pytest.raises(ConfigError, match="GiB free, but the checkpoints of this run .*need about"):
        check_disk(tmp_path, model)


def test_an_offline_dataset_with_missing_hidden_states_is_refused_before_training(trained_run, cache_dir, tmp_path):
    import shutil

    data_dir = Path(json.loads((trained_run / "summary.json").read_text())["data_dir"])
    broken = tmp_path / "data"
    shutil.copytree(data_dir, broken)
    (broken / "hidden_states" / "hs_7.safetensors").unlink()
    run_dir = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run_dir}", "data=offline", f"data.path={broken}", *SMALL_DATA[2:]], cache_dir,
                  timeout=120)
    assert proc.returncode != 0 and "hs_7.safetensors" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (run_dir / "checkpoints").exists()
    (broken / "dataset_info.json").unlink()
    (broken / "state.json").write_text("not json")
    proc = launch([f"hydra.run.dir={tmp_path / 'run2'}", "data=offline", f"data.path={broken}"], cache_dir, timeout=120)
    assert proc.returncode != 0 and "not a dataset" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_stop_on_an_eval_every_step_owes_its_val_pass_to_the_resumed_run(cache_dir, tmp_path, monkeypatch):
    """The stop check comes before the optim.eval_every val pass: a signal landing on step 4 saves `last` without
    that pass. The resumed run runs it first, so its val rows are an uninterrupted run's."""
    import eagle3.train.loop
    from eagle3.errors import Interrupted
    from eagle3.init.checkpoint import load_draft, load_trainer_state
    from eagle3.train.loop import Training, train
    from eagle3.train.track import Tracker

    class StopAtStep4(eagle3.train.loop.StopRequest):
        calls = 0

        def requested(self, world):
            StopAtStep4.calls += 1  # once per optimizer step
            return StopAtStep4.calls == 4

    overrides = ["optim.max_steps=8", "optim.eval_every=4"]

    def run(run_dir, model=None, state=None):
        cfg, built, loaders = small_run(cache_dir, run_dir, overrides) if model is None else held
        with Tracker(run_dir, cfg.logger, cfg.run, resume_step=state["progress"]["step"] if state else None) as t:
            return train(Training(model or built, loaders, cfg, t, resume_state=state))

    held = small_run(cache_dir, tmp_path / "whole", overrides)
    run(tmp_path / "whole", held[1])
    whole = [(r["step"], r["loss"]) for r in read_rows(tmp_path / "whole") if r["split"] == "val"]
    assert [step for step, _ in whole] == [0, 4, 8]

    monkeypatch.setattr(eagle3.train.loop, "StopRequest", StopAtStep4)
    held = small_run(cache_dir, tmp_path / "stopped", overrides)
    with pytest.raises(Interrupted):
        run(tmp_path / "stopped", held[1])
    last = tmp_path / "stopped" / "checkpoints" / "last"
    state = load_trainer_state(last)
    assert state["progress"]["step"] == 4
    run(tmp_path / "stopped", load_draft(last, attn_impl="sdpa"), state)
    resumed = [(r["step"], r["loss"]) for r in read_rows(tmp_path / "stopped") if r["split"] == "val"]
    assert [step for step, _ in resumed] == [0, 4, 8]
    assert [loss for _, loss in resumed] == pytest.approx([loss for _, loss in whole], rel=1e-5)


@pytest.mark.slow
def test_a_signal_while_the_data_is_built_leaves_no_half_built_cache_entry(tmp_path):
    """SIGTERM before training (here while the rows are sampled) is one line and exit 143, and the cache entry being
    built (a temporary dir) is removed on the way out: the same command starts again from nothing."""
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), f"hydra.run.dir={run_dir}", "data=online",
                             "data.synth.num_samples=4096", "logger.mode=disabled"], cwd=ROOT, text=True,
                            env={**os.environ, "EAGLE3_CACHE": str(cache), "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    datasets, deadline = cache / "datasets", time.time() + 120
    while time.time() < deadline and not (datasets.is_dir() and any(datasets.iterdir())):
        time.sleep(0.05)
    time.sleep(1)  # inside the build
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert "SIGTERM while building and checking the run's verifier and data" in out and "Traceback" not in out
    assert datasets.is_dir() and not any(datasets.iterdir()), list(datasets.iterdir())


class NoHandler(Exception):
    """A signal that reached the test's own handler: the run had none of its own in place."""


@contextlib.contextmanager
def signal_in_the_first_val_pass(signum: int):
    """The next run in this process sends itself `signum` as its first val pass begins (a real signal, delivered
    by the OS, at a moment no timing decides); a signal that finds no handler of the run's fails the test instead
    of stopping pytest."""
    import eagle3.train.loop as loop

    real = loop.run_validation

    def signalled(*args, **kwargs):
        loop.run_validation = real
        signal.raise_signal(signum)
        return real(*args, **kwargs)

    def unhandled(s, frame):
        raise NoHandler(f"{signal.Signals(s).name} reached no handler of the run")

    previous = {s: signal.signal(s, unhandled) for s in (signal.SIGINT, signal.SIGTERM)}
    loop.run_validation = signalled
    try:
        yield
    finally:
        loop.run_validation = real
        for s, handler in previous.items():
            signal.signal(s, handler)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_in_the_first_val_pass_is_one_line_and_resume_starts_the_run_again(signum, cache_dir, tmp_path):
    """Ctrl-C in the step-0 val pass (minutes on a real verifier) printed a 40-frame KeyboardInterrupt traceback and
    SIGTERM died without a word; then resume= said checkpoints/last is missing and a new run in the dir said to
    resume it. One line, exit 128 + the signal, and resume= starts the run again from step 0, which a new run there
    is told too. The run is in this process (the signal to a process of its own is
    test_sigterm_saves_a_checkpoint_that_resume_continues's and test_rank_faults')."""
    from eagle3.console import resume_command
    from eagle3.run.inputs import materialize_inputs

    run, overrides = tmp_path / "run", ["optim.max_steps=2", *SMALL_DATA, "logger.mode=disabled"]
    materialize_inputs(typed_run_config(cache_dir, run, overrides))  # built: stderr holds no progress bar of it
    with signal_in_the_first_val_pass(signum):
        proc = launch([f"hydra.run.dir={run}", *overrides], cache_dir)
    assert proc.returncode == 128 + signum, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [
        f"{signum.name} while the val pass before the first step: stopped before its first step; nothing half-built "
        f"is kept: start it again from step 0 with {resume_command(run)}"], proc.stderr[-3000:]
    assert not (run / "failure.json").exists()

    again = launch([f"hydra.run.dir={run}", *overrides], cache_dir)
    assert again.returncode == 1
    assert f"start it again from step 0 with {resume_command(run)}" in again.stderr, again.stderr[-2000:]

    resumed = launch([f"resume={run}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert [(r["step"], r["split"]) for r in read_rows(run) if r["split"] == "val"] == [(0, "val"), (2, "val")]
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
