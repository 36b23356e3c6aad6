"""tests/commands.py's in-process runs of `eagle3 VERB`, `python launch.py` and `python -m MODULE`: the exit status and
console a process would have, and nothing of the test process left changed."""

from __future__ import annotations

import logging
import os
import signal

import pytest

from commands import launch, launch_process, run_in_process


@pytest.mark.slow  # starts launch.py as a process, twice
@pytest.mark.parametrize("override", ["optim.lr=abc", "+optim.lr_warmup=0.1"])  # Hydra's refusal; the schema's
def test_a_refusal_in_process_is_the_processs_status_and_console(override, tmp_path):
    args = [override, f"hydra.run.dir={tmp_path / 'run'}"]
    in_process, process = launch(args, tmp_path / "cache"), launch_process(args, tmp_path / "cache")
    assert in_process.returncode == process.returncode == 1
    assert (in_process.stdout, in_process.stderr) == (process.stdout, process.stderr)
    assert not (tmp_path / "run").exists()


def test_a_run_in_process_gives_back_what_it_changed(tmp_path):
    before = (dict(os.environ), os.getcwd(), list(logging.getLogger().handlers), logging.getLogger().level,
              signal.getsignal(signal.SIGTERM))
    os.chdir(tmp_path)
    try:
        proc = launch(["--cfg", "job", "--resolve"], tmp_path / "cache", EAGLE3_PROBE="1")
        after = (dict(os.environ), os.getcwd(), list(logging.getLogger().handlers), logging.getLogger().level,
                 signal.getsignal(signal.SIGTERM))
    finally:
        os.chdir(before[1])
    assert proc.returncode == 0 and "optim:" in proc.stdout and f"cache_dir: {tmp_path / 'cache'}" in proc.stdout
    assert after == (before[0], str(tmp_path), *before[2:])


def test_a_module_in_process_prints_its_error_as_the_interpreter_does(tmp_path):
    proc = run_in_process(["python", "-m", "eagle3.sweep.compare", str(tmp_path / "nowhere")])
    assert proc.returncode != 0 and proc.stderr.startswith("error: ") and "Traceback" not in proc.stderr
    assert str(tmp_path / "nowhere") in proc.stderr
    with pytest.raises(ValueError, match="eagle3 VERB"):
        run_in_process(["bash", "launch.py"])


def test_a_printed_eagle3_command_runs_in_process_as_the_console_script_of_this_checkout(tmp_path):
    """`eagle3 VERB ARGS`, as the library prints what to run next, is eagle3.cli's main here: the same config as
    `python launch.py ARGS`."""
    verb = run_in_process(["eagle3", "train", "--cfg", "job"], tmp_path / "cache")
    old = launch(["--cfg", "job"], tmp_path / "cache")
    assert verb.returncode == old.returncode == 0 and "optim:" in verb.stdout, verb.stderr[-2000:]
    assert verb.stdout == old.stdout
