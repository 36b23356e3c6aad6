"""data=tiny: sequences sampled from the verifier itself (a random prompt masked out of the loss, then a sampled
response), with their hidden states, in speculators' on-disk format; built once into cache_dir, keyed by their
parameters (eagle3.data.synthetic)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eagle3.config import DraftConfig, TinyDataConfig
from eagle3.data.sources.offline import HiddenStateFilesSource
from eagle3.data.sources.registry import register

if TYPE_CHECKING:
    from eagle3.config import RunConfig
    from eagle3.plan.parts import DataStats


@register(TinyDataConfig)
class TinySource(HiddenStateFilesSource[TinyDataConfig]):
    def materialize(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.synthetic import synthetic_dataset_dir

        return synthetic_dataset_dir(verifier_dir, self.data.synth, cfg.model.draft.aux_layer_ids, cfg.cache_dir,
                                     self.data.hidden_states_dtype.value)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        from eagle3.plan.parts import DTYPE_BYTES
        from eagle3.plan.sizes import synth_stats

        dtype_bytes = DTYPE_BYTES[self.data.hidden_states_dtype.value]
        per_token = (len(draft.aux_layer_ids) + 1) * draft.hidden_size * dtype_bytes
        return synth_stats(self.data.synth, self.data.train_ratio, per_token)
