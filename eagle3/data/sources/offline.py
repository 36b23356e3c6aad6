"""data=offline: an existing speculators-format dataset (Arrow rows with their hidden states in files, such as
speculators' vLLM pipeline or python -m eagle3.data.prepare writes), and what every source whose hidden states are
files shares (`HiddenStateFilesSource`: the reader thread, its prefetch ring, the files' start-up check)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from eagle3.config import DraftConfig, HiddenStateFiles, OfflineDataConfig
from eagle3.data.sources.registry import Source, register

if TYPE_CHECKING:
    from eagle3.config import RunConfig
    from eagle3.data.check import CheckReport
    from eagle3.data.loader import Loader
    from eagle3.data.online import OnlineVerifier
    from eagle3.plan.parts import DataStats, Term

Files = TypeVar("Files", bound=HiddenStateFiles)


class HiddenStateFilesSource(Source[Files]):
    """Rows whose hidden states are files (hidden_states/hs_<i>.safetensors), read ahead by the reader thread."""

    def check_rows(self, cfg: RunConfig, verifier_dir: Path, data_dir: Path) -> CheckReport:
        from eagle3.data.check import check_dataset
        from eagle3.data.record import check_record

        draft = cfg.model.draft
        check_record(data_dir, verifier_dir, draft)
        return check_dataset(data_dir, num_slots=len(draft.aux_layer_ids) + 1, hidden_size=draft.hidden_size,
                             vocab_size=draft.vocab_size, total_seq_len=self.data.total_seq_len)

    def loaders(self, data_dir: Path, verifier: OnlineVerifier | None, run_dir: Path | None = None,
                **common: Any) -> tuple[Loader, Loader]:
        from eagle3.data.loader import LoaderSpec, build_loaders

        return build_loaders(data_dir, LoaderSpec(train_ratio=self.data.train_ratio, prefetch=self.data.prefetch,
                                                  **common))

    def buffer_terms(self, draft: DraftConfig, device_type: str) -> list[Term]:
        from eagle3.plan.memory import hidden_buffers

        return hidden_buffers(draft, self.data, device_type, ring=self.data.prefetch + 1)


@register(OfflineDataConfig)
class OfflineSource(HiddenStateFilesSource[OfflineDataConfig]):
    def materialize(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        return Path(self.data.path)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        from eagle3.plan.sizes import arrow_stats

        return arrow_stats(Path(self.data.path), self.data.train_ratio, hidden_files=True)
