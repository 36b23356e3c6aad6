"""data=tiny: sequences sampled from the verifier itself (a random prompt masked out of the loss, then a sampled
response), with their hidden states, in speculators' on-disk format; built once into cache_dir, keyed by their
parameters (eagle3.data.synthetic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from eagle3.config import DraftConfig, SynthConfig
from eagle3.data.sources.offline import HiddenStateFiles
from eagle3.data.sources.registry import register

if TYPE_CHECKING:
    from eagle3.config import RunConfig, TrainConfig
    from eagle3.plan.memory import DataStats


@register
@dataclass
class TinyDataConfig(HiddenStateFiles):
    name: str = "tiny"
    synth: SynthConfig = field(default_factory=SynthConfig)

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        self.synth.check()

    def materialize(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.synthetic import synthetic_dataset_dir

        return synthetic_dataset_dir(verifier_dir, self.synth, cfg.model.draft.aux_layer_ids, cfg.cache_dir,
                                     self.hidden_states_dtype.value)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        from eagle3.plan.memory import DTYPE_BYTES
        from eagle3.plan.sizes import synth_stats

        per_token = (len(draft.aux_layer_ids) + 1) * draft.hidden_size * DTYPE_BYTES[self.hidden_states_dtype.value]
        return synth_stats(self.synth, self.train_ratio, per_token)
