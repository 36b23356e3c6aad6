"""data=online: token rows alone, whose hidden states the verifier computes inside the training loop, in every
rank (eagle3/data/online.py); no hidden state touches the disk. `TokenRows` is what every such source shares (the
verifier in the rank, its start-up checks, the loaders, the plan's terms); a source of its own kind of token rows
subclasses it and says only where its rows come from (`token_rows`)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config import (
    ROWS_FILES,
    BadSamplePolicy,
    DataConfig,
    DraftConfig,
    RowFormat,
    SynthConfig,
    _require,
    _rows_path_problem,
)
from eagle3.data.sources.registry import register

if TYPE_CHECKING:
    from eagle3.config import RunConfig, TrainConfig
    from eagle3.data.check import CheckReport
    from eagle3.data.loader import Loader
    from eagle3.data.online import OnlineVerifier
    from eagle3.plan import DataStats, Term

log = logging.getLogger(__name__)

# Under the run dir: the train rows' hidden states data.cache_gb keeps (one dir per rank), removed when the run ends.
HIDDEN_CACHE_DIR = "online_hidden_cache"


@dataclass
class TokenRows(DataConfig):
    """Token rows whose hidden states the verifier, held by every rank, computes in the loop."""

    # true: shard the verifier across the job's ranks (FSDP2, forward only), for one that does not fit a device;
    # false: a full copy per rank (bf16 on CUDA, fp32 on CPU)
    shard_verifier: bool = False
    # What data.path's rows hold: auto (the first row's format, recorded with the rows) | tokens ({"input_ids",
    # "loss_mask"}) | messages ({"messages": [{"role", "content"}]}) | sharegpt ({"conversations": [{"from",
    # "value"}]}); a row of another format is a bad row
    format: RowFormat = RowFormat.auto
    # Only the first records of data.path are read (bad ones counted among them), the rest of the file never is:
    # the head of a large file such as ShareGPT's 125 MB JSON array. null: every record
    max_records: int | None = None
    # Disk (GB, 1e9 bytes) for the train rows' hidden states of the first epoch, read back by the later epochs
    # instead of running the verifier again (in the run dir, removed when the run ends; rows beyond it are computed
    # at every epoch). 0: off, every epoch runs the verifier over every row, nothing is written (a run with one
    # epoch gains nothing from it)
    cache_gb: float = 0.0

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        _require(self.max_records is None or self.max_records >= 1, "data.max_records",
                 f"must be null (every record) or at least 1, got {self.max_records}")
        _require(math.isfinite(self.cache_gb) and self.cache_gb >= 0, "data.cache_gb",
                 f"must be >= 0 (0: off) and finite, got {self.cache_gb}")
        _require(not (self.shard_verifier and self.cache_gb > 0), "data.cache_gb",
                 "keeps hidden states a rank computed alone, and data.shard_verifier=true makes each forward a "
                 "collective every rank must join at every micro-batch: drop data.cache_gb, or the sharding")
        _require(not (self.shard_verifier and run.eval.accept.enabled), "eval.accept.enabled",
                 "measures on rank 0 with the whole verifier, and data.shard_verifier=true shards it across the "
                 "ranks; measure the saved checkpoint afterwards with python -m eagle3.eval.accept --run <run dir>")
        _require(not (self.shard_verifier and run.train.on_policy.enabled), "train.on_policy.enabled",
                 "decodes with the whole verifier in each rank, and data.shard_verifier=true shards it across the "
                 "ranks")

    def verifier_in_rank(self) -> str | None:
        return "sharded" if self.shard_verifier else "full"

    def token_rows(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        """The dir of Arrow rows (input_ids, loss_mask, seq_len) and token_freq.pt the ranks read (see
        eagle3.data.token_rows.save_rows), built into cfg.cache_dir when the source builds one."""
        raise NotImplementedError

    def materialize(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.online import check_online_verifier

        check_online_verifier(verifier_dir, cfg.model.draft)  # before reading or sampling rows with it
        if self.shard_verifier and cfg.distributed.world_size == 1:
            log.warning("data.shard_verifier=true with one rank: nothing to shard across, the rank holds the whole "
                        "verifier (distributed=ddp or fsdp with nproc_per_node > 1 shards it)")
        return self.token_rows(cfg, verifier_dir)

    def check_rows(self, cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> CheckReport:
        """No hidden states to check: the token ids, lengths and loss masks (the verifier was checked already)."""
        from eagle3.data.check import check_dataset
        from eagle3.data.online import verifier_positions
        from eagle3.data.record import check_same_verifier

        positions = verifier_positions(verifier_dir)
        check_same_verifier(data_dir, verifier_dir)  # an Arrow dir prepared for another verifier: its tokenizer
        return check_dataset(data_dir, vocab_size=cfg.model.draft.vocab_size, total_seq_len=self.total_seq_len,
                             hidden_states=False, max_positions=positions)

    def loaders(self, data_dir: Path, verifier: OnlineVerifier | None, run_dir: Path | None = None,
                **common: Any) -> tuple[Loader, Loader]:
        import torch

        from eagle3.data.loader import build_loaders
        from eagle3.data.online import HiddenStore

        store = None
        if self.cache_gb > 0 and run_dir is not None:  # the budget shared by the ranks, each its own train rows
            rank, world_size = common.get("rank", 0), common.get("world_size", 1)
            store = HiddenStore(int(self.cache_gb * 1e9) // world_size,
                                Path(run_dir) / HIDDEN_CACHE_DIR / f"rank_{rank}", base=Path(run_dir))
            log.info("data.cache_gb=%g: the train rows' hidden states of the first epoch are kept in %s for the "
                     "epochs after it (%.2f GB for this rank)", self.cache_gb, store.directory, store.budget / 1e9)
        return build_loaders(data_dir, train_ratio=self.train_ratio, verifier=verifier,
                             hidden_states_dtype=getattr(torch, self.hidden_states_dtype.value), train_store=store,
                             **common)

    def hidden_cache_bytes(self) -> int:
        return int(self.cache_gb * 1e9)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        return None

    def buffer_terms(self, draft: DraftConfig, device_type: str) -> list[Term]:
        from eagle3.plan import hidden_buffers

        return hidden_buffers(draft, self, device_type, ring=None)


@register
@dataclass
class OnlineDataConfig(TokenRows):
    """Rows from data.path, or without one sampled from the verifier as data.synth says (the tiny default's: the
    same rows data=tiny trains on; cached under cache_dir, keyed by their content)."""

    name: str = "online"
    # Token rows: {"input_ids", "loss_mask"} rows, or conversations ({"messages"}, ShareGPT's {"conversations"};
    # rendered with the verifier's chat template, every assistant turn trained) in a JSONL file, a JSON array, a
    # Parquet file or a datasets dir (save_to_disk); a speculators-format dataset dir's Arrow rows are read as they
    # are (hidden states are not read). null: rows sampled as data.synth says
    path: str | None = None
    synth: SynthConfig = field(default_factory=SynthConfig)   # only without data.path

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        self.synth.check()
        if self.path is None:
            _require(self.format == RowFormat.auto, "data.format",
                     f"describes data.path's rows, and there is no data.path (rows are sampled from the verifier): "
                     f"drop data.format={self.format.value}, or give data.path")
            _require(self.max_records is None, "data.max_records",
                     "bounds the records read from data.path, and there is no data.path (rows are sampled from the "
                     "verifier; data.synth.num_samples says how many): drop data.max_records, or give data.path")
            return
        changed = [f"data.synth.{k}" for k, v in vars(self.synth).items() if v != getattr(SynthConfig(), k)]
        _require(not changed, changed[0] if changed else "data.synth",
                 f"describes the rows data=online samples without a data.path, and data.path={self.path} gives the "
                 f"rows: drop the data.synth override, or data.path to sample rows")
        if dataset_required:
            self._check_path(Path(self.path))

    def _check_path(self, p: Path) -> None:
        # Under on_bad_sample=skip a bad first line is a counted skip like any other, not a wrong file.
        problem = _rows_path_problem(p, first_line=self.on_bad_sample == BadSamplePolicy.error)
        _require(problem is None, "data.path",
                 f"{self.path} {problem}; data=online reads token rows: {ROWS_FILES} (a speculators-format dataset "
                 f"dir's Arrow rows are read as they are; its hidden states are not read)")

    def token_rows(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.token_rows import token_rows_dir

        return token_rows_dir(self, verifier_dir, cfg.cache_dir)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        from eagle3.plan_inputs import arrow_stats, synth_stats

        if self.path is None:
            return synth_stats(self.synth, self.train_ratio, 0)
        return arrow_stats(Path(self.path), self.train_ratio, hidden_files=False)

    def no_rows_reason(self) -> str:
        if self.path is not None and not Path(self.path).is_dir():
            return (f"the rows of {self.path} are not counted before a run reads and tokenizes them (a speculators-"
                    f"format dataset dir as data.path is counted)")
        return ""
