"""data=online: token rows alone, whose hidden states the verifier computes inside the training loop, in every
rank (eagle3/data/online.py); no hidden state touches the disk. `TokenRowsSource` is what every such source shares
(the verifier in the rank, its start-up checks, the loaders, the plan's terms); a source of its own kind of token
rows subclasses it and says only where its rows come from (`token_rows`)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eagle3.config import DraftConfig, OnlineDataConfig, TokenRows
from eagle3.data.sources.registry import Source, register
from eagle3.rundir.files import HIDDEN_CACHE_DIR  # under the run dir: the hidden states data.cache_gb keeps

if TYPE_CHECKING:
    from eagle3.config import RunConfig, TrainConfig
    from eagle3.data.check import CheckReport
    from eagle3.data.loader import Loader
    from eagle3.data.online import OnlineVerifier
    from eagle3.plan.parts import DataStats, Term

log = logging.getLogger(__name__)

Rows = TypeVar("Rows", bound=TokenRows)


class TokenRowsSource(Source[Rows]):
    """Token rows whose hidden states the verifier, held by every rank, computes in the loop."""

    def token_rows(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        """The dir of Arrow rows (input_ids, loss_mask, seq_len) and token_freq.pt the ranks read (see
        eagle3.data.token_rows.save_rows), built into cfg.cache_dir when the source builds one."""
        raise NotImplementedError

    def materialize(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.online import check_online_verifier

        check_online_verifier(verifier_dir, cfg.model.draft)  # before reading or sampling rows with it
        if self.data.shard_verifier and cfg.distributed.world_size == 1:
            log.warning("data.shard_verifier=true with one rank: nothing to shard across, the rank holds the whole "
                        "verifier (distributed=ddp or fsdp with nproc_per_node > 1 shards it)")
        return self.token_rows(cfg, verifier_dir)

    def check_rows(self, cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> CheckReport:
        """No hidden states to check: the token ids, lengths and loss masks (the verifier was checked already)."""
        from eagle3.data.check import check_dataset
        from eagle3.data.record import check_same_verifier
        from eagle3.verifier.model import Verifier

        positions = Verifier(verifier_dir).positions
        check_same_verifier(data_dir, verifier_dir)  # an Arrow dir prepared for another verifier: its tokenizer
        return check_dataset(data_dir, vocab_size=cfg.model.draft.vocab_size, total_seq_len=self.data.total_seq_len,
                             hidden_states=False, max_positions=positions)

    def loaders(self, data_dir: Path, verifier: OnlineVerifier | None, run_dir: Path | None = None,
                **common: Any) -> tuple[Loader, Loader]:
        import torch

        from eagle3.data.loader import LoaderSpec, build_loaders
        from eagle3.data.online import HiddenStore

        store = None
        if self.data.cache_gb > 0 and run_dir is not None:  # the budget shared by the ranks, each its own train rows
            rank, world_size = common.get("rank", 0), common.get("world_size", 1)
            store = HiddenStore(self.hidden_cache_bytes() // world_size,
                                Path(run_dir) / HIDDEN_CACHE_DIR / f"rank_{rank}", base=Path(run_dir))
            log.info("data.cache_gb=%g: the train rows' hidden states of the first epoch are kept in %s for the "
                     "epochs after it (%.2f GB for this rank)", self.data.cache_gb, store.directory,
                     store.budget / 1e9)
        dtype = getattr(torch, self.data.hidden_states_dtype.value)
        spec = LoaderSpec(train_ratio=self.data.train_ratio, **common, hidden_states_dtype=dtype)
        return build_loaders(data_dir, spec, verifier, train_store=store)

    def hidden_cache_bytes(self) -> int:
        return int(self.data.cache_gb * 1e9)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        return None

    def buffer_terms(self, draft: DraftConfig, device_type: str) -> list[Term]:
        from eagle3.plan.memory import hidden_buffers

        return hidden_buffers(draft, self.data, device_type, ring=None)


@register(OnlineDataConfig)
class OnlineSource(TokenRowsSource[OnlineDataConfig]):
    """Rows from data.path, or without one sampled from the verifier as data.synth says."""

    def refuse_early(self, cfg: TrainConfig) -> None:
        from eagle3.data.token_rows import refuse_row_selection_of_a_dataset_dir

        refuse_row_selection_of_a_dataset_dir(self.data)

    def token_rows(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.token_rows import token_rows_dir

        return token_rows_dir(self.data, verifier_dir, cfg.cache_dir)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        from eagle3.plan.sizes import arrow_stats, synth_stats

        if self.data.path is None:
            return synth_stats(self.data.synth, self.data.train_ratio, 0)
        return arrow_stats(Path(self.data.path), self.data.train_ratio, hidden_files=False)

    def no_rows_reason(self) -> str:
        if self.data.path is not None and not Path(self.data.path).is_dir():
            return (f"the rows of {self.data.path} are not counted before a run reads and tokenizes them (a "
                    f"speculators-format dataset dir as data.path is counted)")
        return ""
