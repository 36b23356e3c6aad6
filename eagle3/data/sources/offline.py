"""data=offline: an existing speculators-format dataset (Arrow rows with their hidden states in files, such as
speculators' vLLM pipeline or python -m eagle3.data.prepare writes), and what every source whose hidden states are
files shares (`HiddenStateFiles`: the reader thread, its prefetch ring, the files' start-up check)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from omegaconf import MISSING

from eagle3.config import DataConfig, DraftConfig, _require, _require_dir
from eagle3.data.sources.registry import register

if TYPE_CHECKING:
    from eagle3.config import RunConfig, TrainConfig
    from eagle3.data.check import CheckReport
    from eagle3.data.loader import Loader
    from eagle3.data.online import OnlineVerifier
    from eagle3.plan import DataStats, Term


@dataclass
class HiddenStateFiles(DataConfig):
    """Rows whose hidden states are files (hidden_states/hs_<i>.safetensors), read ahead by the reader thread."""

    # Micro-batches the reader thread reads ahead (each holds one buffer of (total_seq_len + 1) x (aux layers + 1)
    # x hidden values)
    prefetch: int = 2

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        _require(self.prefetch >= 0, "data.prefetch", f"must be >= 0, got {self.prefetch}")

    def check_rows(self, cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> CheckReport:
        from eagle3.data.check import check_dataset
        from eagle3.data.record import check_record

        draft = cfg.model.draft
        check_record(data_dir, verifier_dir, draft)
        return check_dataset(data_dir, num_slots=len(draft.aux_layer_ids) + 1, hidden_size=draft.hidden_size,
                             vocab_size=draft.vocab_size, total_seq_len=self.total_seq_len)

    def loaders(self, data_dir: Path, verifier: OnlineVerifier | None, run_dir: Path | None = None,
                **common: Any) -> tuple[Loader, Loader]:
        from eagle3.data.loader import build_loaders

        return build_loaders(data_dir, train_ratio=self.train_ratio, prefetch=self.prefetch, **common)

    def buffer_terms(self, draft: DraftConfig, device_type: str) -> list[Term]:
        from eagle3.plan import hidden_buffers

        return hidden_buffers(draft, self, device_type, ring=self.prefetch + 1)


@register
@dataclass
class OfflineDataConfig(HiddenStateFiles):
    name: str = "offline"
    # Required: python launch.py data=offline data.path=/data/my_dataset; <path>/data-*.arrow (input_ids,
    # loss_mask, seq_len), <path>/hidden_states/hs_<i>.safetensors, token_freq.pt
    path: str = MISSING

    writes_cache: ClassVar[bool] = False

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        _require_dir(self.path, "data.path", ["hidden_states"] if dataset_required else [],
                     "a speculators-format dataset: Arrow rows (input_ids, loss_mask, seq_len) saved with "
                     "datasets.save_to_disk, hidden_states/hs_<i>.safetensors and token_freq.pt")

    def materialize(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        return Path(self.path)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        from eagle3.plan_inputs import arrow_stats

        return arrow_stats(Path(self.path), self.train_ratio, hidden_files=True)
