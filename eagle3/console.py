"""What a person sees: our progress bars and results, library chatter off, one log file per extra rank."""

from __future__ import annotations

import logging
import os
import re
import shlex
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")


def mapped_with_progress(fn: Callable[[Item], Result], items: Sequence[Item], desc: str,
                         tokens: Callable[[Result], int], shown: bool = True) -> list[Result]:
    """[fn(item) for item in items], with a bar on stderr while it runs (`shown`): items done of all, their
    tokens per second (`tokens(result)` counts a result's), and the time left at the rate so far."""
    from tqdm import tqdm

    results: list[Result] = []
    done, start = 0, time.perf_counter()
    with tqdm(total=len(items), desc=desc, unit="prompt", disable=not shown, file=sys.stderr, dynamic_ncols=True,
              mininterval=1.0) as bar:
        for item in items:
            results.append(fn(item))
            done += tokens(results[-1])
            bar.set_postfix_str(f"{done / max(time.perf_counter() - start, 1e-9):.1f} tokens/s", refresh=False)
            bar.update()
    return results


def quiet_libraries() -> None:
    """Per-file save/load bars and notices of transformers and speculators go; warnings that matter stay."""
    import transformers
    from loguru import logger

    transformers.utils.logging.disable_progress_bar()
    logger.disable("speculators.utils.loading")  # "Loading from local directory ..." once per tensor group
    warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator.*")


def setup_rank_logging(run_dir: Path, rank: int) -> None:
    """Logging for a rank started by the elastic launcher (Hydra configured only the launching process).

    Rank 0 prints to the console and appends to the run's launch.log; every other rank writes everything,
    including what C code prints, to `<run_dir>/rank_<N>.log`.
    """
    fmt = logging.Formatter(f"[%(asctime)s][%(name)s][%(levelname)s][rank {rank}] - %(message)s")
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    handlers: list[logging.Handler]
    if rank == 0:
        handlers = [logging.StreamHandler(sys.stdout), logging.StreamHandler(log_file(run_dir, "launch.log"))]
    else:
        log_file_ = log_file(run_dir, f"rank_{rank}.log")
        os.dup2(log_file_.fileno(), 1)
        os.dup2(log_file_.fileno(), 2)
        sys.stdout = sys.stderr = log_file_
        handlers = [logging.StreamHandler(log_file_)]
    for handler in handlers:
        handler.setFormatter(fmt)
        root.addHandler(handler)


def log_file(run_dir: Path, name: str) -> IO[str]:
    """A log file of the run dir, opened to append (line-buffered), never through a symlink (eagle3.safe_write)."""
    from eagle3.safe_write import open_write

    return open_write(run_dir, run_dir / name, "a", buffering=1)


def interrupted(message: str) -> SystemExit:
    """Ctrl-C in a command: `message` on stderr, and the exit status a shell gives a process Ctrl-C ended (130)."""
    print(message, file=sys.stderr, flush=True)
    return SystemExit(128 + 2)


def append_log(run_dir: Path, name: str, fmt: str) -> None:
    """The root logger also writes to the run dir's log file `name`, in `fmt`."""
    handler = logging.StreamHandler(log_file(run_dir, name))
    handler.setFormatter(logging.Formatter(fmt))
    logging.getLogger().addHandler(handler)


# Values Hydra's override grammar reads as they are; anything else (`=`, `,`, spaces, brackets ...) is quoted.
_PLAIN_VALUE = re.compile(r"[\w./~+-]+")


def hydra_override(key: str, value: object) -> str:
    """`key=value` as Hydra's override grammar reads it back to the same string (a sweep job's run dir holds `=`
    and `,`, which Hydra would otherwise parse as a key and a sweep)."""
    return f"{key}={_hydra_value(value)}"


def _hydra_value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    text = str(value)
    if not _PLAIN_VALUE.fullmatch(text):
        text = "'" + text.replace("'", "\\'") + "'"
    return text


def shell_override(key: str, value: object) -> str:
    """`key=value` quoted for Hydra, then for a POSIX shell: what a printed command holds, so that it runs when
    pasted."""
    override = hydra_override(key, value)
    if shlex.quote(override) == override:
        return override
    if not any(c in override for c in '"$`\\!'):  # double quotes read better around Hydra's single quotes
        return f'"{override}"'
    return shlex.quote(override)


def resume_command(run_dir: Path | str) -> str:
    """The command that continues a run in place."""
    return f"eagle3 train {shell_override('resume', run_dir)}"


