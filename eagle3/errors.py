"""The errors a user can cause, by kind: each is reported as one message and a non-zero exit, no traceback.

The launcher and the CLIs catch `UserError`; anything else is a bug and keeps its traceback. Imports nothing
heavy: the launcher's light paths go through it.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem the user can fix (in the config, on disk, in the data); the message says what and where."""


class ConfigError(UserError, ValueError):
    """A config value or a command-line option is wrong or missing."""


class DataError(UserError):
    """A dataset is missing, unreadable, or disagrees with itself or with the run's model config."""


class CheckpointError(UserError):
    """A checkpoint the user pointed at cannot be used as it is; the message names the file and the problem."""


class RunStopped(UserError):
    """Training cannot go on as configured; the message says why and what was kept."""


class ForecastError(UserError):
    """A run's val passes cannot carry a forecast (too few, a flat curve, no tokens recorded); the message says how
    much more training it needs."""


class Interrupted(SystemExit):
    """The run stopped on a signal with `checkpoints/last` saved: exit status 128 + the signal, as a shell reports
    a process the signal ended; resumable, so no failure."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class StoppedBeforeTraining(Interrupted):
    """A signal before the run's first step (while the verifier, rows or data were built or checked, the rank
    started, or the val pass before the first step ran): no half-built cache entry is left, and `resume=` of the
    run dir starts it again from step 0. `during` says what was running, for the launcher's one line."""

    def __init__(self, signum: int, during: str = "") -> None:
        super().__init__(signum)
        self.during = during


class EngineError(UserError):
    """The serving engine cannot be built, started or reached (eagle3.serve); the message names its log file."""


def load_problem(e: BaseException) -> str:
    """Why transformers could not load a model dir, as one line for a message."""
    text = str(e).strip()
    if "trust_remote_code" in text:  # transformers' refusal under trust_remote_code=False
        return ("it names a model or tokenizer class transformers does not know, defined by code in the dir "
                "(auto_map), and code from a model dir is never run")
    return f"{type(e).__name__}: {text.splitlines()[0]}" if text else type(e).__name__
