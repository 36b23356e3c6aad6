"""Starting the ranks of a multi-rank run with torch's elastic launcher (torchrun's engine), and reporting the
first failing rank's own error instead of the agent's. A one-rank run runs in this process.

The ranks are forked from a forkserver (multiprocessing's), started once per launching process with RANK_MODULES
imported: every later launch in that process (the jobs of a sweep, a test session) starts its ranks without
importing torch, transformers and speculators again. What that changes against a spawned rank, and how it is kept
as it was:
- A forked rank has the server's environment, from when the server started, not the launcher's. The launcher hands
  its environment to each rank (eagle3.train.rank.worker), which takes it as its own, with the per-rank variables the
  elastic agent set on top, before anything reads it.
- Libraries read some variables once, when imported (Hugging Face's HF_* constants, torch's TORCH_*, OpenMP's,
  MKL's and OpenBLAS' thread settings, the loader's LD_*, Python's): the server imported them with the values it
  started with. When one of those (IMPORT_TIME_ENV) differs at a launch from what it was then, or the launcher's
  stdout/stderr are other files (the ranks print to the server's), the server is stopped and started afresh.
- The server only imports: no torch op runs in it (GNU OpenMP's thread pool does not survive a fork), and nothing
  it imports initializes CUDA (a forked child could not use it; speculators asks torch.cuda.is_available() when
  imported, which the server answers from NVML), so ranks use the GPU as spawned ones did.
- It exits with the launching process: the launcher stops it at exit (and it stops by itself once the launcher
  and its ranks are gone, e.g. after a SIGKILL)."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config import RunConfig
from eagle3.errors import Interrupted, StoppedBeforeTraining
from eagle3.rundir.files import RunDir
from eagle3.rundir.rank_errors import RankFailed, first_rank_error

if TYPE_CHECKING:
    from eagle3.rundir.progress import RunSummary

# What a rank imports, in the forkserver once: eagle3.train.rank's module-level imports, and what a run imports inside
# functions (speculators is most of a rank's start-up; eagle3.data.online: a verifier in the ranks). "__main__"
# (the launching script) as multiprocessing has it by default: a forked rank then does not import it again.
RANK_MODULES = ["__main__", "eagle3.train.rank", "eagle3.data.loader", "eagle3.data.online", "eagle3.formats.vocab",
                "eagle3.provenance", "speculators", "speculators.losses", "speculators.train.utils",
                "speculators.train.distributed_batch_sampler", "transformers.optimization"]
# Prefixes of the environment variables that RANK_MODULES and the libraries they load read when imported (not
# TORCHELASTIC_*: the elastic agent sets those in this process while it runs).
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "TORCH_", "TORCHINDUCTOR_", "TORCHDYNAMO_",
                   "PYTORCH_", "CUDA_", "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "LD_", "PYTHON")
_server_started_with: tuple | None = None  # server_state() when this process's forkserver was started


def run_job(cfg: RunConfig, verifier_dir: Path, data_dir: Path,
            rows: list[int] | None = None) -> RunSummary | None:
    """In this process for one rank; otherwise rank processes from torch's elastic launcher (torchrun's engine)."""
    dist = cfg.distributed
    if dist.world_size == 1:
        from eagle3.train.rank import run_rank

        return run_rank(cfg, verifier_dir, data_dir, rows)

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from eagle3.train.rank import worker

    rdzv: dict[str, Any]
    if dist.nnodes == 1:  # torchrun --standalone: c10d rendezvous on a free local port
        rdzv = {"rdzv_backend": "c10d", "rdzv_endpoint": dist.rdzv_endpoint or "localhost:0",
                "run_id": str(uuid.uuid4())}
    else:  # torchrun --node-rank: static ranks, so global rank 0 (the writer) is on node 0
        rdzv = {"rdzv_backend": "static", "rdzv_endpoint": dist.rdzv_endpoint,
                "rdzv_configs": {"rank": dist.node_rank}, "run_id": "eagle3"}
    # No elastic restarts: a restarted rank would build the draft anew instead of resuming it, and write a second
    # history into the run dir; a failed run continues from checkpoints/last with resume=<run dir>.
    launch_config = LaunchConfig(min_nodes=dist.nnodes, max_nodes=dist.nnodes, nproc_per_node=dist.nproc_per_node,
                                 max_restarts=0, start_method="forkserver", **rdzv)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // dist.nproc_per_node)))
    ensure_forkserver()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    started = time.time()
    try:
        with quiet_elastic_agent():
            results = elastic_launch(launch_config, worker)(cfg, verifier_dir, data_dir, rows, dict(os.environ))
    except SignalException as e:
        # The agent forwarded the signal to the ranks: in the loop they saved checkpoints/last and printed the resume
        # line; before their first step they stopped where they were (eagle3.train.rank.worker), and the launcher
        # says so.
        if RunDir(cfg.run.dir).took_a_step():
            raise Interrupted(int(e.sigval)) from None
        raise StoppedBeforeTraining(int(e.sigval), "starting the ranks") from None
    except ChildFailedError as e:
        raise rank_failure(Path(cfg.run.dir), started, e) from None
    return results.get(0)


def ensure_forkserver() -> None:
    """This process's forkserver running, with RANK_MODULES imported, started with the environment variables read
    at import (IMPORT_TIME_ENV) and the stdout/stderr this process has now (started afresh if either changed)."""
    global _server_started_with
    import multiprocessing
    from multiprocessing import forkserver

    state = server_state()
    if _server_started_with is not None and state != _server_started_with:
        stop_forkserver()
    multiprocessing.set_forkserver_preload(RANK_MODULES)
    # speculators asks torch.cuda.is_available() when imported; torch answers from NVML with this set, where it
    # would otherwise initialize CUDA in the server, and a rank forked from it could not use CUDA.
    with _environ(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        forkserver.ensure_running()
    if _server_started_with is None:
        atexit.register(stop_forkserver)
    _server_started_with = state


@contextlib.contextmanager
def _environ(**env: str):
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


def server_state() -> tuple:
    """What a forked rank has from its server's start: the environment variables read at import, and which files
    its stdout and stderr are."""
    env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV)))
    return env, tuple(_file_identity(fd) for fd in (1, 2))


def _file_identity(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:  # closed
        return None
    return st.st_dev, st.st_ino


def stop_forkserver() -> None:
    """Stops this process's forkserver, if it runs, and waits until it has exited; the next launch starts one
    afresh. It is sent SIGTERM: it holds nothing to save, and tearing down its interpreter with everything it
    imported would take seconds."""
    import signal
    from multiprocessing import forkserver

    server: Any = forkserver._forkserver  # its private parts: Python 3.11 has no public way to stop it
    if server._forkserver_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server._forkserver_pid, signal.SIGTERM)
    server._stop()


@contextlib.contextmanager
def quiet_elastic_agent():
    """The elastic agent logs a failed rank as a banner of exit codes; the launcher reports the rank's own error
    instead (eagle3/rundir/rank_errors.py). Its warnings (a restart, a signal) still show."""
    # torch.multiprocessing: "Terminating process N via signal SIGTERM", the agent stopping the other ranks.
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def rank_failure(run_dir: Path, started: float, failed: Exception) -> Exception:
    """The error to report for ranks that failed: the first failing rank's own, from the record it wrote; when no
    rank could write one (killed by a signal, out of memory), the exit codes and where the ranks' logs are."""
    record = first_rank_error(run_dir, since=started)
    if record is not None:
        return record.as_exception(run_dir)
    failures = getattr(failed, "failures", {}) or {}
    codes = ", ".join(f"rank {f.rank}: exit code {f.exitcode}" for f in failures.values()) or "unknown"
    return RankFailed(f"a rank process died without reporting an error ({codes}; a negative code is the signal "
                      f"that ended it, e.g. -9 for the out-of-memory killer); see {run_dir}/rank_<N>.log",
                      rank_traceback="")
