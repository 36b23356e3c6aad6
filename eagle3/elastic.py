"""Starting the ranks of a multi-rank run with torch's elastic launcher (torchrun's engine), and reporting the
first failing rank's own error instead of the agent's. A one-rank run runs in this process."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config import RunConfig
from eagle3.errors import Interrupted
from eagle3.rank_errors import RankFailed, first_rank_error

if TYPE_CHECKING:
    from eagle3.progress import RunSummary


def run_job(cfg: RunConfig, verifier_dir: Path, data_dir: Path,
            rows: list[int] | None = None) -> RunSummary | None:
    """In this process for one rank; otherwise rank processes from torch's elastic launcher (torchrun's engine)."""
    dist = cfg.distributed
    if dist.world_size == 1:
        from eagle3.rank import run_rank

        return run_rank(cfg, verifier_dir, data_dir, rows)

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from eagle3.rank import worker

    rdzv: dict[str, Any]
    if dist.nnodes == 1:  # torchrun --standalone: c10d rendezvous on a free local port
        rdzv = {"rdzv_backend": "c10d", "rdzv_endpoint": dist.rdzv_endpoint or "localhost:0",
                "run_id": str(uuid.uuid4())}
    else:  # torchrun --node-rank: static ranks, so global rank 0 (the writer) is on node 0
        rdzv = {"rdzv_backend": "static", "rdzv_endpoint": dist.rdzv_endpoint,
                "rdzv_configs": {"rank": dist.node_rank}, "run_id": "eagle3"}
    launch_config = LaunchConfig(min_nodes=dist.nnodes, max_nodes=dist.nnodes, nproc_per_node=dist.nproc_per_node,
                                 max_restarts=0, start_method="spawn", **rdzv)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // dist.nproc_per_node)))
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    started = time.time()
    try:
        with quiet_elastic_agent():
            results = elastic_launch(launch_config, worker)(cfg, verifier_dir, data_dir, rows)
    except SignalException as e:
        # The agent forwarded the signal to the ranks, which saved checkpoints/last and printed the resume line.
        raise Interrupted(int(e.sigval)) from None
    except ChildFailedError as e:
        raise rank_failure(Path(cfg.run.dir), started, e) from None
    return results.get(0)


@contextlib.contextmanager
def quiet_elastic_agent():
    """The elastic agent logs a failed rank as a banner of exit codes; the launcher reports the rank's own error
    instead (eagle3/rank_errors.py). Its warnings (a restart, a signal) still show."""
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
