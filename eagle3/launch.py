"""What launch.py does with a composed config: resolve it, type and check it once (eagle3/config.py's
`run_config`), plan it (eagle3/plan.py: refuse what cannot fit; plan=true prints the plan and stops), write the
run dir, build the verifier and data, then run the rank in this process or start the
ranks with torch's elastic launcher. Past this module the run config is a typed `RunConfig`.

In a multirun each job passes through here in turn (Hydra's basic launcher), so each job gets fresh rank
processes, its own run dir and its own wandb run, and a failed job is recorded and the sweep goes on.
Nothing here imports torch or speculators before the config is known to be good.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shlex
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError, MissingMandatoryValue

from eagle3.config import (
    PretrainedInitConfig,
    RunConfig,
    TrainConfig,
    lr_advice,
    plain_config,
    rows_replace_synth,
    run_config,
)
from eagle3.console import resume_command
from eagle3.errors import ConfigError, DataError, Interrupted, StoppedBeforeTraining, UserError
from eagle3.objective import objective_value
from eagle3.rank_errors import RankFailed, first_rank_error
from eagle3.rundir import CHECKPOINTS, RESOLVED_CONFIG, config_changes, read_run_config, trained_config
from eagle3.study import STUDY_FILE
from eagle3.verifier_shape import unresolvable

if TYPE_CHECKING:
    from eagle3.plan import Plan
    from eagle3.progress import RunSummary

log = logging.getLogger(__name__)


def launch(cfg: DictConfig) -> float | None:
    """Runs one job; returns its objective (cfg.objective: best val tau_sim or accept_len) for a sweeper."""
    hydra = HydraConfig.get()
    try:
        return run_one_job(cfg, hydra)
    finally:
        # A resumed run logs into its own dir, and a refused config wrote nothing: the dir Hydra made for this
        # command then holds only its own files and goes (a run, or a sweep job's failure.json, keeps it).
        remove_if_only_hydras(Path(hydra.runtime.output_dir), hydra.job.name)


def run_one_job(cfg: DictConfig, hydra) -> float | None:
    multirun = hydra.mode is not None and hydra.mode.name == "MULTIRUN"
    run_dir = Path(cfg.resume if cfg.resume else hydra.runtime.output_dir).resolve()
    start = time.perf_counter()
    run_cfg = None  # set once the run dir is this run's: from then on a failure is recorded in it
    try:
        if cfg.plan:  # plan (issue 19): print the memory/time plan and stop; no run dir, nothing built
            show_plan(cfg, hydra, run_dir)
            return None
        run_cfg = load_for_resume(run_dir, hydra) if cfg.resume else fresh_run(cfg, hydra, run_dir)
        if cfg.resume:  # its log goes on in its own launch.log
            handler = logging.FileHandler(run_dir / "launch.log")
            handler.setFormatter(logging.Formatter("[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"))
            logging.getLogger().addHandler(handler)
        if run_cfg.distributed.node_rank == 0:  # wandb logs from global rank 0, on node 0
            from eagle3.track import check_wandb

            check_wandb(run_cfg.logger)  # an account and a network, before any data is built
        from eagle3.stop import stop_before_training  # torch: only once the config is known to be good

        with stop_before_training("building and checking the run's verifier and data"):
            verifier_dir, data_dir = materialize_inputs(run_cfg)
            rows = check_data(run_cfg, verifier_dir, data_dir)
            refuse_zero_steps(run_cfg, data_dir, rows)
        if not cfg.resume:
            preflight(run_cfg, verifier_dir, data_dir)
        summary = run_job(run_cfg, verifier_dir, data_dir, rows)
        # Inside the try: a run whose best val pass has no accept_len is a failed trial, recorded as such.
        objective = objective_value(run_cfg.objective, summary.best) if summary is not None else None
    except StoppedBeforeTraining:  # nothing to resume: the sweep stops here, the job is recorded as not run
        if multirun:
            update_sweep_index(hydra, run_dir, "interrupted", None, "stopped by a signal before training")
        raise
    except Interrupted:  # checkpoints/last is saved and the resume line printed: resumable, not failed
        if multirun:
            update_sweep_index(hydra, run_dir, "stopped", None)
        elif run_cfg is not None and cfg.resume:
            update_resumed_sweep_job(run_dir, "stopped", None)
        raise
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        # Records go only where they describe this job: its own run dir (once its config is written, or a sweep
        # job's fresh dir), never a run that a refused command pointed at (resume=, a reused hydra.sweep.dir).
        ours = run_cfg is not None or (multirun and not cfg.resume
                                       and not (run_dir / RESOLVED_CONFIG).exists())
        if ours:
            record_failure(run_dir, error, getattr(e, "rank_traceback", None))
        if multirun:
            if ours:
                update_sweep_index(hydra, run_dir, "failed", None, error)
            log.error("job %d (%s) failed: %s\n  run dir: %s", hydra.job.num,
                      " ".join(hydra.overrides.task) or "no overrides", e, run_dir)
        elif ours and cfg.resume:
            update_resumed_sweep_job(run_dir, "failed", None, error)
        if isinstance(e, (UserError, RankFailed)) and not multirun and os.environ.get("HYDRA_FULL_ERROR") != "1":
            raise SystemExit(f"error: {e}") from None  # one message on the console, no traceback
        raise
    if summary is None:  # a node other than node 0 of a multi-node job: node 0 writes the results
        return None
    (run_dir / "failure.json").unlink(missing_ok=True)  # a resumed run that completes has not failed
    if multirun:
        update_sweep_index(hydra, run_dir, "completed", summary)
    elif cfg.resume:
        update_resumed_sweep_job(run_dir, "completed", summary, objective=objective)
    log.info("done in %.1f s", time.perf_counter() - start)
    if run_cfg.eval.serve.enabled:
        from eagle3.serve.at_end import serve_finished_run

        try:
            serve_finished_run(run_dir, run_cfg.eval, run_cfg.seed)
        except UserError as e:  # the run itself completed and keeps its results
            if multirun:
                log.error("job %d: serving (eval.serve) failed: %s", hydra.job.num, e)
            else:
                raise SystemExit(f"error: the run completed ({run_dir}), serving it failed (eval.serve): {e}") from None
    return objective


def fresh_run(cfg: DictConfig, hydra, run_dir: Path) -> RunConfig:
    """The typed run config of a new run, checked, and written to the run dir as resolved_config.yaml."""
    resolved = resolve(cfg, hydra, run_dir)
    run_cfg = run_config(resolved)
    check_devices(run_cfg)
    refuse_if_it_cannot_fit(run_cfg)  # plan (issue 19): before anything is written or any rank starts
    if run_cfg.data.online.shard_verifier and run_cfg.distributed.world_size == 1:
        log.warning("data.online.shard_verifier=true with one rank: nothing to shard across, the rank holds the whole "
                    "verifier (distributed=ddp or fsdp with nproc_per_node > 1 shards it)")
    advice, outside = lr_advice(run_cfg.optim, run_cfg.init)
    (log.warning if outside else log.info)(advice)
    if run_cfg.distributed.node_rank == 0:
        hold_run_dir(run_dir)
        refuse_to_overwrite(run_dir)
        (run_dir / RESOLVED_CONFIG).write_text(OmegaConf.to_yaml(resolved))
    return run_cfg


def resolve(cfg: DictConfig, hydra, run_dir: Path) -> dict[str, Any]:
    """The plain, fully resolved config plus what Hydra knows about this job (group choices, overrides)."""
    try:
        container = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)
    except MissingMandatoryValue as e:
        raise ConfigError(f"{e.full_key} is required and has no value: set it, e.g. `{e.full_key}=...`") from None
    except InterpolationResolutionError as e:  # e.g. model=auto without the verifier's config.json
        raise ConfigError(unresolvable(e)) from None
    assert isinstance(container, dict)
    resolved = {str(k): v for k, v in container.items()}
    # data=online with a data.path: the given rows replace the sampled ones, and a data.synth override would change
    # nothing, so it is refused rather than dropped. data.online.enabled follows the data option: overriding it
    # would run one mode under the other's name.
    overrides = [o.lstrip("+~") for o in hydra.overrides.task]
    enabled = [o for o in overrides if o.startswith("data.online.enabled")]
    if enabled:
        raise ConfigError(f"data.online.enabled: set by the data option (data=online: true; data=tiny or offline: "
                          f"false), not on its own; choose data=online or data=tiny instead of {enabled[0]}")
    normalized = rows_replace_synth(resolved)
    synth = [o for o in overrides if o.startswith("data.synth")]
    if synth and normalized is not resolved:
        raise ConfigError(f"{synth[0].split('=')[0]}: data=online with data.path reads its rows from there; "
                          f"data.synth only describes the rows sampled without a data.path")
    resolved = {**normalized, **absolute_paths(normalized)}
    choices = {g: c for g, c in hydra.runtime.choices.items() if not g.startswith("hydra") and c is not None}
    multirun = hydra.mode is not None and hydra.mode.name == "MULTIRUN"
    name = hydra.job.override_dirname or run_dir.name
    resolved["run"] = {
        "dir": str(run_dir),
        "name": name,
        # Every job of a sweep shares its group in wandb: the sweep dir, unique per sweep.
        "group": f"{Path(hydra.sweep.dir).parent.name}_{Path(hydra.sweep.dir).name}" if multirun else name,
        "choices": choices,
        "overrides": list(hydra.overrides.task),
    }
    return resolved


def absolute_paths(plain: dict[str, Any]) -> dict[str, Any]:
    """The parts of the config whose paths are relative to where launch.py ran, with those paths made absolute, so
    that the run dir's resolved_config.yaml means the same files wherever `resume=` is run from."""
    def absolute(part: Any, *keys: str) -> Any:
        if not isinstance(part, dict):
            return part
        key, rest = keys[0], keys[1:]
        value = part.get(key)
        if rest:
            return {**part, key: absolute(value, *rest)}
        return {**part, key: os.path.abspath(value)} if isinstance(value, str) and value else part

    out = {"data": absolute(plain.get("data"), "path"), "init": absolute(plain.get("init"), "path"),
           "model": absolute(plain.get("model"), "verifier", "path"),
           "eval": absolute(plain.get("eval"), "accept", "prompts")}
    if isinstance(plain.get("cache_dir"), str):
        out["cache_dir"] = os.path.abspath(plain["cache_dir"])
    return {k: v for k, v in out.items() if v is not None}


# >>> plan (issue 19): plan=true and the fit guard; the plan itself is eagle3/plan.py.
def run_plan(cfg: TrainConfig) -> Plan:
    """The plan of this run (eagle3.plan) with what the machine and the disk say (eagle3.plan_inputs)."""
    from eagle3.plan import make_plan
    from eagle3.plan_inputs import dataset_stats, device_and_memory, rows_unknown_reason, verifier_shape, verifier_size

    draft, dist = cfg.model.draft, cfg.distributed
    kind, memory, source = device_and_memory(cfg.device, dist.device_memory_gb, in_process=dist.world_size == 1,
                                             ranks_per_node=dist.nproc_per_node)
    online = cfg.data.online.enabled
    # Online, every rank holds the verifier and eval.accept reuses it; offline only eval.accept loads it (rank 0).
    accept_loads = cfg.eval.accept.enabled and not online
    verifier_bytes, verifier_note = verifier_size(cfg.model.verifier) if accept_loads else (0, "")
    train_lm_head = isinstance(cfg.init, PretrainedInitConfig) and cfg.init.train_lm_head
    return make_plan(draft, cfg.data, cfg.optim, dist, device_type=kind, device_memory=memory,
                     device_memory_source=source, train_lm_head=train_lm_head,
                     data_stats=dataset_stats(cfg.data, draft.hidden_size, draft.aux_layer_ids),
                     no_rows_reason=rows_unknown_reason(cfg.data), verifier_bytes=verifier_bytes,
                     verifier_note=verifier_note,
                     online_verifier=verifier_shape(cfg.model.verifier) if online else None)


def show_plan(cfg: DictConfig, hydra, run_dir: Path) -> None:
    """`plan=true`: types and checks the config as a run would, except that data.path need not hold a dataset yet
    (a plan reads no data), prints the plan, and removes the run dir Hydra made for this job when nothing but
    Hydra's own files is in it, also when the config is refused. With `resume=<run dir>`: the plan of that run,
    from its own config."""
    from eagle3.plan import NO_FIT_STATUS, check_fits, format_plan

    try:
        if cfg.resume:
            run_cfg = run_config(read_run_config(Path(cfg.resume)), dataset_required=False)
        else:
            run_cfg = run_config(resolve(cfg, hydra, run_dir), dataset_required=False)
        plan = run_plan(run_cfg)
        print(format_plan(plan), flush=True)
        try:
            check_fits(plan)
        except ConfigError as e:  # printed as a run would refuse it; its own status, so that a script can gate
            print(f"error: {e}", file=sys.stderr, flush=True)
            raise SystemExit(NO_FIT_STATUS) from None
    finally:
        remove_if_only_hydras(Path(hydra.runtime.output_dir), hydra.job.name)


def remove_if_only_hydras(hydra_dir: Path, job_name: str) -> None:
    """Removes the run dir Hydra made for a job that wrote nothing into it (and its date dir, when then empty)."""
    if hydra_dir.is_dir() and {p.name for p in hydra_dir.iterdir()} <= {".hydra", f"{job_name}.log"}:
        import shutil

        shutil.rmtree(hydra_dir)
        try:
            hydra_dir.parent.rmdir()  # Hydra's date dir, when this was its only run
        except OSError:
            pass


def refuse_if_it_cannot_fit(cfg: TrainConfig) -> None:
    """Stops a run whose planned peak per rank exceeds the device's memory (eagle3.plan.check_fits)."""
    from eagle3.plan import check_fits, human

    plan = run_plan(cfg)
    check_fits(plan)
    of = f"of {human(plan.device_memory)} ({plan.device_memory_source})" if plan.device_memory else \
        f"({plan.device_memory_source})"
    log.info("plan: about %s per rank %s; python launch.py plan=true ... for the terms", human(plan.peak), of)
# <<< plan (issue 19)


def load_for_resume(run_dir: Path, hydra) -> RunConfig:
    """The run's own resolved config, through the same schemas and checks as a fresh run's; resuming changes
    nothing about the run."""
    others = [o for o in hydra.overrides.task if not o.startswith(("resume=", "hydra."))]
    if others:
        raise ConfigError(f"resume continues a run with its own resolved_config.yaml and takes no other "
                          f"overrides; remove: {' '.join(others)}")
    resolved = read_run_config(run_dir)
    if resolved.get("distributed", {}).get("node_rank", 0) == 0:
        hold_run_dir(run_dir)
    from eagle3.checkpoint import load_trainer_state, resumable_last

    last = resumable_last(run_dir / CHECKPOINTS)  # whole, or restored from a save stopped between its renames
    resolved["resume"] = str(run_dir)
    log.info("resuming %s", run_dir)
    run_cfg = run_config(resolved)
    trained = load_trainer_state(last, mmap=True).get("config")
    changes = config_changes(trained, trained_config(plain_config(run_cfg))) if trained is not None else []
    if changes:  # e.g. fewer ranks (another global batch), or an lr the restored scheduler would not train at
        raise ConfigError(f"resume: {run_dir / RESOLVED_CONFIG} no longer says what {last} was trained with: "
                          f"{'; '.join(changes)}. Restore those values to continue the run, or start a new one")
    check_devices(run_cfg)
    return run_cfg


def check_devices(cfg: TrainConfig) -> None:
    """What the config asks of this machine's devices, before anything is built (imports torch only then)."""
    dist = cfg.distributed
    if cfg.device != "cuda" and dist.backend != "nccl":
        return
    import torch

    wants = "device=cuda" if cfg.device == "cuda" else "distributed.backend=nccl"
    if not torch.cuda.is_available():
        raise ConfigError(f"{wants} needs a CUDA GPU, and torch sees none on this machine; use device=auto (or cpu)"
                          f"{' and distributed.backend=auto (gloo on CPU)' if dist.backend == 'nccl' else ''}")
    if torch.cuda.device_count() < dist.nproc_per_node:
        raise ConfigError(f"distributed.nproc_per_node={dist.nproc_per_node} starts one rank per GPU, and this "
                          f"machine has {torch.cuda.device_count()}")


_held_run_dirs: list[IO[str]] = []  # open lock files: a run dir's lock lasts as long as this process


def hold_run_dir(run_dir: Path) -> None:
    """Takes the run dir for this process, so that two runs started in the same second (Hydra names run dirs by
    the second) or two resumes of one run cannot write into one dir together."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:  # never through a symlink: the lock is a file of this dir
        lock = open(run_dir / ".lock", "a", opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW))
    except OSError as e:
        raise ConfigError(f"{run_dir}/.lock cannot be this run's lock ({e.strerror}: a symlink?); nothing was "
                          f"written: remove it or choose another hydra.run.dir") from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise ConfigError(f"{run_dir} is in use by another run (started in the same second, or resuming it); "
                          f"nothing was written: choose another hydra.run.dir") from None
    _held_run_dirs.append(lock)


def refuse_to_overwrite(run_dir: Path) -> None:
    links = links_leading_out(run_dir)
    if links:
        raise ConfigError(f"{run_dir} holds symlinks that lead outside it or nowhere ({', '.join(links[:4])}"
                          f"{', ...' if len(links) > 4 else ''}): a run writes its files into its dir and would write "
                          f"through them; nothing was written: remove them or choose another hydra.run.dir")
    if (run_dir / CHECKPOINTS).exists() or (run_dir / "metrics.jsonl").exists():
        raise ConfigError(f"{run_dir} already holds a run (checkpoints or metrics.jsonl); nothing was "
                          f"overwritten: continue it with {resume_command(run_dir)}, or choose another "
                          f"hydra.run.dir")


def links_leading_out(run_dir: Path) -> list[str]:
    """The symlinks in `run_dir` and its subdirs (.hydra/, wandb/: where Hydra, the run and wandb write; links not
    followed) whose target is missing or outside it, as "name -> target"."""
    if not run_dir.is_dir():
        return []
    inside = run_dir.resolve()
    top = list(run_dir.iterdir())
    entries = top + [e for d in top if d.is_dir() and not d.is_symlink() for e in d.iterdir()]
    return sorted(f"{e.relative_to(run_dir)} -> {os.readlink(e)}" for e in entries
                  if e.is_symlink() and (not e.exists() or not e.resolve().is_relative_to(inside)))


def materialize_inputs(cfg: RunConfig) -> tuple[Path, Path]:
    """The verifier dir and data dir this run reads, building the tiny verifier and synthetic data if asked."""
    from eagle3.console import quiet_libraries
    from eagle3.data.synthetic import synthetic_dataset_dir
    from eagle3.data.verifier import tiny_verifier_dir

    verifier, data = cfg.model.verifier, cfg.data
    if verifier.path is None or data.path is None or data.online.enabled:  # the cache is written: writable?
        from eagle3.hydra_callbacks import output_dir_problem

        problem = output_dir_problem(Path(cfg.cache_dir).absolute())
        if problem:
            raise ConfigError(f"cache_dir: {problem}; set cache_dir (or $EAGLE3_CACHE) to a writable dir")
    quiet_libraries()
    if verifier.path is not None:
        from eagle3.data.verifier_forward import load_config

        verifier_dir = Path(verifier.path)
        load_config(verifier_dir)  # a model type of transformers' own, not code in the dir (never run)
    else:
        assert verifier.tiny is not None  # VerifierConfig.check: exactly one of them
        verifier_dir = tiny_verifier_dir(verifier.tiny, cfg.cache_dir)
    if data.online.enabled:  # token rows only: the hidden states are computed in the loop
        from eagle3.data.online import check_online_verifier
        from eagle3.data.token_rows import token_rows_dir

        check_online_verifier(verifier_dir, cfg.model.draft)  # before reading or sampling rows with it
        return verifier_dir, token_rows_dir(data, verifier_dir, cfg.cache_dir)
    if data.path is not None:
        return verifier_dir, Path(data.path)
    assert data.synth is not None  # DataConfig.check: exactly one of them
    data_dir = synthetic_dataset_dir(verifier_dir, data.synth, cfg.model.draft.aux_layer_ids, cfg.cache_dir,
                                     data.hidden_states_dtype)
    return verifier_dir, data_dir


def check_data(cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> list[int] | None:
    """The start-up data check, once before any rank starts: the data's record against the model config, then
    every row's hidden-state file header and token ids (eagle3.data.check's quick part). Returns the rows to
    train on when bad ones are skipped, None for all; writes `data_check.json` into a fresh run dir."""
    from eagle3.data.check import check_dataset
    from eagle3.data.record import check_record
    from eagle3.data.vocab import vocab_mapping

    draft, policy = cfg.model.draft, cfg.data.on_bad_sample.value
    if cfg.resume:
        refuse_other_rows(Path(cfg.run.dir), data_dir)
    if cfg.data.online.enabled:  # no hidden states to check: the verifier (checked in materialize_inputs) instead
        from eagle3.data.online import verifier_positions
        from eagle3.data.record import check_same_verifier

        positions = verifier_positions(verifier_dir)
        check_same_verifier(data_dir, verifier_dir)  # an Arrow dir prepared for another verifier: its tokenizer
        report = check_dataset(data_dir, vocab_size=draft.vocab_size, total_seq_len=cfg.data.total_seq_len,
                               hidden_states=False, max_positions=positions)
    else:
        check_record(data_dir, verifier_dir, draft)
        report = check_dataset(data_dir, num_slots=len(draft.aux_layer_ids) + 1, hidden_size=draft.hidden_size,
                               vocab_size=draft.vocab_size, total_seq_len=cfg.data.total_seq_len)
    # Online rows read from a JSONL: the lines left out while reading it (data.on_bad_sample=skip), recorded with
    # the cached rows, so that every run on them says so, not only the one that built the cache entry.
    source_skips = source_skipped(data_dir) if cfg.data.online.enabled else None
    run_dir = Path(cfg.run.dir)
    if not cfg.resume and cfg.distributed.node_rank == 0:
        (run_dir / "data_check.json").write_text(json.dumps({**report.as_dict(), "policy": policy,
                                                             "skipped_rows": sorted(report.bad),
                                                             **({"source_skipped": source_skips}
                                                                if source_skips else {})}, indent=2) + "\n")
    if source_skips:
        log.warning("%s: %d rows skipped while reading it (data.on_bad_sample=skip): %s", source_skips["source"],
                    sum(source_skips["counts"].values()), source_skips["counts"])
    if report.bad and policy == "error":
        full_check = ("" if cfg.data.online.enabled else f"; python -m eagle3.data.check "
                      f"{shlex.quote(str(data_dir))} checks everything, NaN included")
        raise DataError(f"{report.summary()}\ndata.on_bad_sample=skip trains without them (counted in "
                        f"data_check.json){full_check}")
    if report.bad:
        log.warning("%s\nskipping them (data.on_bad_sample=skip)", report.summary())
    truncation = report.truncation_warning()  # raises above eagle3.data.check.TRUNCATION_ERROR_SHARE
    if truncation:
        log.warning(truncation)
    # Built once here, so that ranks only read the cached d2t/t2d files.
    vocab_mapping(data_dir, draft.draft_vocab_size, draft.vocab_size)
    return report.good_rows if report.bad else None


def refuse_zero_steps(cfg: RunConfig, data_dir: Path, rows: list[int] | None) -> None:
    """A step takes world_size x grad_accum packed micro-batches: an epoch with fewer would train nothing."""
    from eagle3.data.loader import train_steps
    from eagle3.rank import micro_batch_len, pick_device

    length = micro_batch_len(cfg, pick_device(cfg.device, 0).type)
    ranks, accum = cfg.distributed.world_size, cfg.optim.grad_accum
    if ranks * accum == 1 or train_steps(data_dir, length, cfg.data.train_ratio, cfg.seed, rows, ranks, accum):
        return
    micro_batches = train_steps(data_dir, length, cfg.data.train_ratio, cfg.seed, rows)
    raise ConfigError(f"this run would train 0 steps: a step takes optim.grad_accum={accum} x {ranks} rank(s) = "
                      f"{accum * ranks} packed micro-batches of {length} tokens, and an epoch of the train split of "
                      f"{data_dir} packs into {micro_batches}. Lower optim.grad_accum or the number of ranks, or "
                      f"train on more rows")


def refuse_other_rows(run_dir: Path, data_dir: Path) -> None:
    """A resumed run must read the rows it started on: its data_check.json names the data dir, and online rows from
    a JSONL live in a dir keyed by the file's content, so an edited file gives another dir (and another draft
    vocabulary than the checkpoint's)."""
    try:
        started_on = json.loads((run_dir / "data_check.json").read_text())["data_dir"]
    except (OSError, ValueError, KeyError):
        return  # a run dir from before the record: nothing to compare
    if Path(started_on) != Path(data_dir):
        raise DataError(f"resume: {run_dir} trained on the rows in {started_on}, and its config now gives "
                        f"{data_dir} (the data changed since the run started: an edited JSONL is other rows); "
                        f"resuming would continue on other data. Restore the data, or start a new run")


def source_skipped(rows_dir: Path) -> dict[str, Any] | None:
    """The JSONL lines left out when online token rows were read from one (their record, eagle3_rows.json):
    {"source", "counts" by kind, "examples"}; None when none were."""
    from eagle3.data.token_rows import read_rows_record

    record = read_rows_record(rows_dir)
    if not record or not record.get("skipped"):
        return None
    return {"source": record.get("source"), "counts": record["skipped"], "examples": record.get("skipped_examples", [])}


def preflight(cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> None:
    """The initializer's checks that need no weights (a checkpoint's files, keys, shapes), before any rank starts."""
    from eagle3.init import InitContext, preflight_draft

    preflight_draft(InitContext(draft=cfg.model.draft, init=cfg.init, verifier_dir=verifier_dir,
                                data_dir=data_dir, attn_impl="sdpa", overrides=cfg.run.overrides))


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
                                 max_restarts=dist.max_restarts, start_method="spawn", **rdzv)
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


def record_failure(run_dir: Path, error: str, error_traceback: str | None = None) -> None:
    """A failed run says why in its run dir (`failure.json`), so a sweep's survivors stay readable. A rank's error
    brings its own traceback; otherwise the one being handled here."""
    if not run_dir.is_dir():
        return
    failure = {"error": error, "traceback": error_traceback or traceback.format_exc()}
    try:
        (run_dir / "failure.json").write_text(json.dumps(failure, indent=2) + "\n")
    except OSError as e:  # a full disk, the failure itself perhaps: the console still has the message
        (run_dir / "failure.json").unlink(missing_ok=True)
        log.warning("%s: the failure record could not be written (%s)", run_dir / "failure.json", e.strerror or e)


def update_sweep_index(hydra, run_dir: Path, status: str, summary: RunSummary | None,
                       error: str | None = None) -> None:
    """`<sweep_dir>/index.json`: one entry per job with its overrides, status and headline results."""
    job = {"num": hydra.job.num, "name": hydra.job.override_dirname, "run_dir": str(run_dir),
           "overrides": list(hydra.overrides.task)}
    write_index_entry(Path(hydra.sweep.dir), job, status, summary, error)


def update_resumed_sweep_job(run_dir: Path, status: str, summary: RunSummary | None,
                             error: str | None = None, objective: float | None = None) -> None:
    """A resumed sweep job's entry in its sweep's index.json (the run dir's parent), if it has one; a trial of an
    Optuna study there that ended is told to the study (its value, or FAIL)."""
    index_file = run_dir.parent / "index.json"
    try:
        jobs = json.loads(index_file.read_text())["jobs"]
    except (OSError, ValueError, KeyError):
        return
    for job in jobs:  # by the job dir's name: the sweep dir may have been moved since the index was written
        if Path(job.get("run_dir", "")).name == run_dir.name:
            base = {**{k: job[k] for k in ("num", "name", "overrides") if k in job}, "run_dir": str(run_dir)}
            write_index_entry(run_dir.parent, base, status, summary, error)
            if status != "stopped" and (run_dir.parent / STUDY_FILE).is_file():
                from eagle3.study import tell_resumed_trial

                tell_resumed_trial(run_dir.parent, job["num"], objective if status == "completed" else None)
            return


def write_index_entry(sweep_dir: Path, job: dict[str, Any], status: str, summary: RunSummary | None,
                      error: str | None) -> None:
    """Replaces the job's entry (by `num`) in `<sweep_dir>/index.json`. A stopped job gets its resume command."""
    index_file = sweep_dir / "index.json"
    entry = {**job, "status": status, "error": error}
    if status == "stopped":
        entry["resume"] = resume_command(job["run_dir"])
    if summary is not None:
        entry.update(steps=summary.steps, best_tau_sim=summary.best["tau_sim"], best_step=summary.best["step"],
                     final_loss=summary.final["loss"], final_tau_sim=summary.final["tau_sim"])
    # Jobs of a sweep may finish at once (Slurm, optuna's n_jobs): the read-modify-write holds a lock, and each
    # writer has its own temporary file.
    with open(sweep_dir / "index.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        jobs = json.loads(index_file.read_text())["jobs"] if index_file.exists() else []
        jobs = [j for j in jobs if j["num"] != entry["num"]] + [entry]
        tmp = index_file.with_name(f".index.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"sweep_dir": str(sweep_dir.resolve()),
                                   "jobs": sorted(jobs, key=lambda j: j["num"])}, indent=2) + "\n")
        os.replace(tmp, index_file)
