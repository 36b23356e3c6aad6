"""Where a run dir keeps its files. A run dir works wherever it is: the paths inside it are stored relative to it
(summary.json's checkpoints) or re-derived from the dir the user names (resolved_config.yaml's `run.dir`), so a
run dir that was moved or copied resumes, evaluates and compares as itself, and never as the run that once stood
at its old path. Imports nothing heavy: the launcher's light paths go through it.

`RunDir(path)` is the one room for the run dir's files: its lock, the refusal of a dir that already holds a run,
and typed reads and writes of the resolved config, summary.json, failure.json, init_report.json and
data_check.json (a sweep's index.json is eagle3/rundir/sweep_index.py's). Each JSON file is a dataclass record with
`from_dict`/`to_dict` (the keys on disk are the fields); a file that is not one is one message naming it, and
every write is whole or not at all (a temporary file, then a rename).
"""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3 import safe_write
from eagle3.errors import ConfigError
from eagle3.rundir.progress import CHECKPOINTS, RunSummary
from eagle3.rundir.records import read_record, record_from_dict, record_to_dict, write_json

if TYPE_CHECKING:
    from eagle3.config import RunConfig

RESOLVED_CONFIG = "resolved_config.yaml"
SUMMARY = "summary.json"
FAILURE = "failure.json"
INIT_REPORT = "init_report.json"
DATA_CHECK = "data_check.json"
METRICS = "metrics.jsonl"
LOCK = ".lock"
LAUNCH_LOG = "launch.log"
# data=online's data.cache_gb: the train rows' hidden states of the first epoch (one dir per rank), removed at the end.
HIDDEN_CACHE_DIR = "online_hidden_cache"
# The names a run (and eval.accept, eagle3.serve) writes in its dir: a symlink at one is refused wherever it leads.
WRITTEN = (RESOLVED_CONFIG, SUMMARY, FAILURE, INIT_REPORT, DATA_CHECK, METRICS, LOCK, LAUNCH_LOG, "rank_*.log",
           "wandb_run_id", CHECKPOINTS, f"{CHECKPOINTS}/*", "rank_errors", "rank_errors/*", "accept_k*.json",
           "serve_vllm_*", ".*.tmp", HIDDEN_CACHE_DIR, f"{HIDDEN_CACHE_DIR}/*")


def checkpoint_dir(run_dir: str | Path, name: str) -> Path:
    """`<run_dir>/checkpoints/<name>` (name: last or best)."""
    return Path(run_dir) / CHECKPOINTS / name


def read_run_config(run_dir: Path, what: str = "resume") -> dict[str, Any]:
    """A run dir's resolved_config.yaml, plain, with `run.dir` the dir given here (where the run is now, not where
    it was made). `what` names the option that gave the dir, for the message."""
    import yaml

    config_file = run_dir / RESOLVED_CONFIG
    if not config_file.is_file():
        raise ConfigError(f"{what}: {run_dir} is not a run dir (no {RESOLVED_CONFIG})")
    try:
        plain = yaml.safe_load(config_file.read_text())
    except (UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{what}: {config_file} is not YAML ({type(e).__name__})") from None
    if not isinstance(plain, dict) or not isinstance(plain.get("run", {}), dict):
        raise ConfigError(f"{what}: {config_file} is not a resolved run config (no mapping of keys to values)")
    plain["run"] = {**plain.get("run", {}), "dir": str(run_dir)}
    return todays_layout(plain)


# Keys a run config once had and has no longer, by part: an old run dir's are left out so that it still reads.
# distributed.max_restarts: torch elastic's restarts, refused past 0 since a restarted rank would build the draft anew
# instead of resuming it (eagle3/run/elastic.py passes 0); a failed run continues with resume=<run dir>.
DELETED_KEYS = {"distributed": ("max_restarts",)}


def todays_layout(plain: dict[str, Any]) -> dict[str, Any]:
    """A plain run config as an older launcher wrote it (a run dir's resolved_config.yaml, a checkpoint's config)
    in today's layout: its data part as below (data_part_before_sources), the keys since deleted (DELETED_KEYS) left
    out; any other config as it is."""
    plain = data_part_before_sources(plain)
    for part, keys in DELETED_KEYS.items():
        if isinstance(plain.get(part), dict):
            plain = {**plain, part: {k: v for k, v in plain[part].items() if k not in keys}}
    return plain


def data_part_before_sources(plain: dict[str, Any]) -> dict[str, Any]:
    """The plain run config with a data part written before the data sources' registry in today's layout; any
    other config as it is. Reads the layout of one schema for every data option: `path` and `synth` (null where
    unused), `prefetch` (unused online) and `online: {enabled, shard_verifier}`. A key it does not know stays, for
    the schemas to refuse by name."""
    data = plain.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("online"), dict):
        return plain
    online = dict(data["online"])
    enabled = online.pop("enabled", False)
    shard = online.pop("shard_verifier", False)
    out = {k: v for k, v in data.items() if k != "online" and not (k in ("path", "synth") and v is None)}
    if enabled:
        out.pop("prefetch", None)
    if enabled or shard:
        out["shard_verifier"] = shard
    if online:
        out["online"] = online
    return {**plain, "data": out}


# What a resume may change: where the run dir and the inputs' cache are, where this node is in a multi-node job,
# and how it is logged. Anything else changes the training the checkpoint is part of.
RESUME_MAY_CHANGE = ("run.", "resume", "cache_dir", "logger.", "distributed.node_rank", "distributed.rdzv_endpoint")


def trained_config(plain: dict[str, Any]) -> dict[str, Any]:
    """The part of a plain run config that a checkpoint is trained with (its `run` and `resume` are where it lies)."""
    return {k: v for k, v in plain.items() if k not in ("run", "resume")}


def config_changes(trained: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """`key: trained -> now` for each key whose value differs, besides those a resume may change."""
    before, after = flatten(trained), flatten(now)
    keys = sorted(k for k in before.keys() | after.keys()
                  if not k.startswith(RESUME_MAY_CHANGE) and before.get(k) != after.get(k))
    return [f"{k}: {before.get(k)!r} -> {after.get(k)!r}" for k in keys]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"optim": {"lr": 1e-3}} -> {"optim.lr": 1e-3}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def output_dir_problem(path: Path) -> str | None:
    """Why `path` cannot be a run's output dir (an existing file, or a dir or parent no file can be written
    in), or None. Probes by writing, so a read-only mount is caught for root too."""
    if path.exists() and not path.is_dir():
        return f"{path} is an existing file, not a directory"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{path} cannot be created: {existing} is a file"
    try:
        fd, probe = tempfile.mkstemp(prefix=".eagle3-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        where = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        return f"{path} {where} ({e.strerror})"
    return None


@dataclass
class FailureRecord:
    """failure.json: why a run failed (the error's one line) and the traceback."""

    error: str
    traceback: str = ""

    @classmethod
    def from_dict(cls, plain: Any) -> FailureRecord:
        return record_from_dict(cls, plain)

    def to_dict(self) -> dict[str, Any]:
        return record_to_dict(self)


@dataclass
class InitReport:
    """init_report.json: which initializer built the draft, and what it says it did (its own keys, kept as given)."""

    initializer: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, plain: Any) -> InitReport:
        if not isinstance(plain, dict):
            raise ValueError(f"not a JSON object but {type(plain).__name__}")
        head = record_from_dict(cls, {"initializer": plain.get("initializer")} if "initializer" in plain else {})
        return cls(head.initializer, {k: v for k, v in plain.items() if k != "initializer"})

    def to_dict(self) -> dict[str, Any]:
        return {"initializer": self.initializer, **self.details}


@dataclass
class DataCheck:
    """data_check.json: the start-up data check of the rows a run trains on (eagle3.data.check's report), the
    data.on_bad_sample policy, the rows skipped, the JSONL lines left out while reading online rows, and for
    regenerated rows their responses' counts (truncated, empty: eagle3.data.regenerate.generation_counts)."""

    data_dir: str
    rows: int
    bad: int
    counts: dict[str, Any]
    full: bool
    first_bad: list[dict[str, Any]]
    policy: str
    skipped_rows: list[int]
    truncated: dict[str, Any] | None = None
    source_skipped: dict[str, Any] | None = None
    generation: dict[str, Any] | None = None

    @classmethod
    def from_dict(cls, plain: Any) -> DataCheck:
        return record_from_dict(cls, plain)

    def to_dict(self) -> dict[str, Any]:
        return record_to_dict(self, omit_none=("truncated", "source_skipped", "generation"))


# --- the room ----------------------------------------------------------------------------------------------------


def holder_pid(holder: str) -> int | None:
    """The pid in a lock's holder line (`pid N: <command>`, eagle3.safe_write.this_process), None when it names
    none."""
    head = holder.split(":", 1)[0].strip()
    return int(head[4:]) if head.startswith("pid ") and head[4:].isdigit() else None


class RunDir:
    """A run's dir and the files in it."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

    def is_run(self) -> bool:
        """Whether it is a run dir at all (its config was written, or it failed before that)."""
        return self.file(RESOLVED_CONFIG).is_file() or self.file(FAILURE).is_file()

    # --- taking it ---
    def hold(self, holder: str | None = None, resuming: bool = False) -> RunDir:
        """Takes the dir for this process, so that two runs started in the same second (Hydra names run dirs by
        the second), two resumes of one run, or two serves of it cannot write into one dir together. The lock file
        names its holder (`holder`, default: this pid and command line) for the one refused; a resume refused is
        told to wait for that process or stop it, not to choose another dir."""
        self.path.mkdir(parents=True, exist_ok=True)
        try:
            safe_write.hold_lock(self.path, self.file(LOCK), holder)  # held as long as this process
        except safe_write.LockHeld as e:
            raise self.in_use(e.holder, resuming) from None
        return self

    def keep(self) -> RunDir:
        """`hold`, unless this process holds the dir already (a new run's is taken before Hydra writes into it:
        eagle3/run/hydra_callbacks.py)."""
        return self if safe_write.holds(self.file(LOCK)) else self.hold()

    def refuse_if_in_use(self, resuming: bool = False) -> None:
        """The refusal `hold` gives when another process holds the dir, seen without writing anything in it."""
        holder = safe_write.lock_holder(self.file(LOCK)) if self.path.is_dir() else None
        if holder is not None:
            raise self.in_use(holder, resuming)

    def in_use(self, holder: str, resuming: bool) -> ConfigError:
        pid = holder_pid(holder)
        who = f"process {pid}" if pid is not None else "another process"
        if resuming:
            stop = f"kill -TERM {pid}" if pid is not None else "SIGTERM"
            return ConfigError(f"resume: {self.path} is in use by {who}, which is running or resuming this run; "
                               f"nothing was written: wait for it to end, or stop it ({stop}: a stopped run saves its "
                               f"state) and resume again")
        return ConfigError(f"{self.path} is in use by another run (started in the same second, or resuming it), or a "
                           f"serve of it: {holder}; nothing was written: choose another hydra.run.dir")

    def refuse_links(self, advice: str = "remove them") -> None:
        """Refuses, before anything is written, a run dir whose files (or dirs) a run would write through a symlink
        that leads outside it or nowhere (eagle3.safe_write refuses each write through any link there too)."""
        links = self.links_leading_out()
        if links:
            raise ConfigError(f"{self.path} holds symlinks that lead outside it or nowhere, or stand at a name the "
                              f"run writes ({', '.join(links[:4])}{', ...' if len(links) > 4 else ''}): a run writes "
                              f"its files into its dir and would write through them; nothing was written: {advice}")

    def refuse_to_overwrite(self) -> None:
        """Refuses a dir that holds a run, or symlinks a run would write through; says what `resume=` does with
        the run there (eagle3/run/resume.py): continue it, start it again from step 0, or nothing."""
        from eagle3.console import resume_command

        self.refuse_links("remove them or choose another hydra.run.dir")
        if not (self.file(CHECKPOINTS).exists() or self.file(METRICS).exists()):
            return
        if not self.took_a_step():
            raise ConfigError(f"{self.path} already holds a run stopped before its first step; nothing was "
                              f"overwritten: start it again from step 0 with {resume_command(self.path)}, or choose "
                              f"another hydra.run.dir")
        if not self.last_saved():
            raise ConfigError(f"{self.path} already holds a run that took steps (metrics.jsonl) and saved no "
                              f"checkpoints/last, so there is nothing to continue; nothing was overwritten: choose "
                              f"another hydra.run.dir")
        raise ConfigError(f"{self.path} already holds a run (checkpoints or metrics.jsonl); nothing was "
                          f"overwritten: continue it with {resume_command(self.path)}, or choose another "
                          f"hydra.run.dir")

    # --- how far the run got ---
    def last_saved(self) -> bool:
        """Whether checkpoints/last is there, whole or as a save stopped between its renames (.last.tmp, .last.old:
        eagle3.init.checkpoint.resumable_last)."""
        checkpoints = self.file(CHECKPOINTS)
        return any((checkpoints / name).exists() or (checkpoints / name).is_symlink()
                   for name in ("last", ".last.tmp", ".last.old"))

    def took_a_step(self) -> bool:
        """Whether the run got past its first step: a checkpoints/last saved, or a metrics.jsonl row past step 0 (a
        line cut short says nothing). A run stopped or failed before it (in its data build, its rank's start, its
        step-0 val pass) has nothing to continue: `resume=` starts it again from step 0."""
        if self.last_saved():
            return True
        metrics = self.file(METRICS)
        if not metrics.is_file() or metrics.is_symlink():
            return False
        for line in metrics.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(step, (int, float)) and step > 0:
                return True
        return False

    def links_leading_out(self) -> list[str]:
        """The symlinks in the dir and its subdirs (.hydra/, wandb/: where Hydra, the run and wandb write; links
        not followed) whose target is missing or outside it, and those at a name the run, eval.accept or
        eagle3.serve writes wherever they lead, as "name -> target"."""
        if not self.path.is_dir():
            return []
        inside = self.path.resolve()
        top = list(self.path.iterdir())
        entries = top + [e for d in top if d.is_dir() and not d.is_symlink() for e in d.iterdir()]
        return sorted(f"{e.relative_to(self.path)} -> {os.readlink(e)}" for e in entries
                      if e.is_symlink() and (not e.exists() or not e.resolve().is_relative_to(inside)
                                             or any(fnmatch.fnmatch(str(e.relative_to(self.path)), name)
                                                    for name in WRITTEN)))

    # --- the resolved config ---
    def write_config(self, resolved: dict[str, Any]) -> None:
        """resolved_config.yaml from `resolved`, a run config's plain form (eagle3.config.plain_config)."""
        from omegaconf import OmegaConf

        safe_write.write_text(self.path, self.file(RESOLVED_CONFIG), OmegaConf.to_yaml(resolved))

    def read_config(self, what: str = "resume") -> dict[str, Any]:
        return read_run_config(self.path, what)

    def typed_config(self, what: str = "resume", dataset_required: bool = True, **values: Any) -> RunConfig:
        """resolved_config.yaml (with `values` set) typed and checked through this version's schemas, as a fresh
        run's config is; a key or value they refuse is the file's, not the command line's: the message names it."""
        from eagle3.config import run_config
        from eagle3.verifier.shape import check_verifier_dir

        try:
            cfg = run_config({**self.read_config(what), **values}, dataset_required)
            check_verifier_dir(cfg.model)
            return cfg
        except ConfigError as e:
            raise ConfigError(f"{what}: {self.file(RESOLVED_CONFIG)} (the run's config, read through this version's "
                              f"schemas): {e}") from None

    # --- summary.json ---
    def write_summary(self, summary: RunSummary) -> None:
        write_json(self.file(SUMMARY), summary.to_dict(), self.path)

    def read_summary(self) -> RunSummary:

        return read_record(self.file(SUMMARY), RunSummary, "a run summary")

    # --- failure.json ---
    def write_failure(self, failure: FailureRecord) -> None:
        write_json(self.file(FAILURE), failure.to_dict(), self.path)

    def read_failure(self) -> FailureRecord:
        return read_record(self.file(FAILURE), FailureRecord, "a failure record")

    def clear_failure(self) -> None:
        self.file(FAILURE).unlink(missing_ok=True)

    # --- init_report.json and data_check.json ---
    def write_init_report(self, report: InitReport) -> None:
        write_json(self.file(INIT_REPORT), report.to_dict(), self.path)

    def read_init_report(self) -> InitReport:
        return read_record(self.file(INIT_REPORT), InitReport, "an init report")

    def write_data_check(self, check: DataCheck) -> None:
        write_json(self.file(DATA_CHECK), check.to_dict(), self.path)

    def read_data_check(self) -> DataCheck:
        return read_record(self.file(DATA_CHECK), DataCheck, "a data check record")
