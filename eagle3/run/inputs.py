"""The inputs a run reads, made ready before any rank starts: the verifier dir and the data dir (building the tiny
verifier, the synthetic rows or online token rows when asked), checked once (the data's record, every row's
header and token ids; the result in the run dir's data_check.json), and the initializer's weight-free checks.
Imports nothing heavy at module level."""

from __future__ import annotations

import logging
import shlex
from pathlib import Path
from typing import Any

from eagle3.config import RunConfig
from eagle3.data.sources import source_of
from eagle3.errors import ConfigError, DataError
from eagle3.rundir.files import DATA_CHECK, DataCheck, RunDir, output_dir_problem

log = logging.getLogger(__name__)


def materialize_inputs(cfg: RunConfig) -> tuple[Path, Path]:
    """The verifier dir and data dir this run reads, building the tiny verifier and synthetic data if asked."""
    from eagle3.console import quiet_libraries
    from eagle3.verifier.tiny import tiny_verifier_dir

    verifier = cfg.model.verifier
    if verifier.path is None or cfg.data.writes_cache:  # the cache is written: writable?
        problem = output_dir_problem(Path(cfg.cache_dir).absolute())
        if problem:
            raise ConfigError(f"cache_dir: {problem}; set cache_dir (or $EAGLE3_CACHE) to a writable dir")
    quiet_libraries()
    if verifier.path is not None:
        from eagle3.verifier.model import Verifier

        verifier_dir = Path(verifier.path)
        Verifier(verifier_dir).transformers_config()  # a model type of transformers' own, not code in the dir
    else:
        assert verifier.tiny is not None  # VerifierConfig.check: exactly one of them
        verifier_dir = tiny_verifier_dir(verifier.tiny, cfg.cache_dir)
    return verifier_dir, source_of(cfg.data).materialize(cfg, verifier_dir)


def check_data(cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> list[int] | None:
    """The start-up data check, once before any rank starts: the data's record against the model config, then
    every row's hidden-state file header and token ids (eagle3.data.check's quick part). Returns the rows to
    train on when bad ones are skipped, None for all; writes `data_check.json` into a fresh run dir."""
    from eagle3.formats.vocab import vocab_mapping

    draft, policy = cfg.model.draft, cfg.data.on_bad_sample.value
    if cfg.resume:
        refuse_other_rows(Path(cfg.run.dir), data_dir)
    report = source_of(cfg.data).check_rows(cfg, verifier_dir, data_dir)
    # Token rows read from a JSONL: the lines left out while reading it (data.on_bad_sample=skip), recorded with
    # the cached rows, so that every run on them says so, not only the one that built the cache entry.
    source_skips = source_skipped(data_dir)
    generation = regenerated_counts(data_dir)
    if not cfg.resume and cfg.distributed.node_rank == 0:
        RunDir(cfg.run.dir).write_data_check(DataCheck.from_dict({**report.as_dict(), "policy": policy,
                                                                  "skipped_rows": sorted(report.bad),
                                                                  "source_skipped": source_skips,
                                                                  "generation": generation}))
    if source_skips:
        log.warning("%s: %d rows skipped while reading it (data.on_bad_sample=skip): %s", source_skips["source"],
                    sum(source_skips["counts"].values()), source_skips["counts"])
    if report.bad and policy == "error":
        full_check = ("" if cfg.data.verifier_in_rank() else f"; eagle3 check "
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
    """A step takes world_size x grad_accum packed micro-batches, each a train row at least: a train split with
    fewer rows would leave micro-batches empty in every step."""
    from eagle3.data.loader import train_lengths
    from eagle3.device.choice import runtime_of
    from eagle3.train.rank import micro_batch_len

    ranks, accum = cfg.distributed.world_size, cfg.optim.grad_accum
    if ranks * accum == 1:
        return
    train_rows = len(train_lengths(data_dir, cfg.data.train_ratio, rows))
    if train_rows >= ranks * accum:
        return
    length = micro_batch_len(cfg, runtime_of(cfg))
    raise ConfigError(f"this run's steps would hold empty micro-batches: a step takes optim.grad_accum={accum} x "
                      f"{ranks} rank(s) = {accum * ranks} packed micro-batches of {length} tokens, a train row at "
                      f"least each, and the train split of {data_dir} has {train_rows} row(s). Lower "
                      f"optim.grad_accum or the number of ranks, or train on more rows")


def refuse_other_rows(run_dir: Path, data_dir: Path) -> None:
    """A resumed run must read the rows it started on: its data_check.json names the data dir, and online rows from
    a JSONL live in a dir keyed by the file's content, so an edited file gives another dir (and another draft
    vocabulary than the checkpoint's)."""
    room = RunDir(run_dir)
    if not room.file(DATA_CHECK).is_file():
        return  # a run dir from before the record: nothing to compare
    started_on = room.read_data_check().data_dir
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


def regenerated_counts(rows_dir: Path) -> dict[str, Any] | None:
    """Regenerated rows' responses as their record counts them ({"responses", "tokens", "truncated", "empty",
    "eos_token_ids"}), logged at every run on them; None for rows that were not regenerated."""
    from eagle3.data.token_rows import read_rows_record

    counts = (read_rows_record(rows_dir) or {}).get("generation")
    if not isinstance(counts, dict):
        return None
    log.info("%s: %d regenerated responses, %d tokens; %d stopped by max_new_tokens or the verifier's positions "
             "before an end-of-sequence token, %d empty", rows_dir, counts["responses"], counts["tokens"],
             counts["truncated"], counts["empty"])
    return counts


def preflight(cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> None:
    """The initializer's checks that need no weights (a checkpoint's files, keys, shapes), before any rank starts."""
    from eagle3.init import InitContext, preflight_draft

    preflight_draft(InitContext(draft=cfg.model.draft, init=cfg.init, verifier_dir=verifier_dir,
                                data_dir=data_dir, attn_impl="sdpa", overrides=cfg.run.overrides))
