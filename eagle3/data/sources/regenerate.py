"""data=regenerate: a prompt set's responses written anew by the verifier itself (eagle3/data/regenerate.py), then
trained on as data=online trains on token rows: the verifier computes their hidden states in the loop. The rows
are built once into cache_dir, keyed by the prompts' bytes, the verifier and `data.regenerate`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from eagle3.config import DraftConfig, RegenerateDataConfig
from eagle3.data.sources.online import TokenRowsSource
from eagle3.data.sources.registry import register
from eagle3.verifier.model import Verifier

if TYPE_CHECKING:
    from eagle3.config import RunConfig, TrainConfig
    from eagle3.plan.parts import DataStats


@register(RegenerateDataConfig)
class RegenerateSource(TokenRowsSource[RegenerateDataConfig]):
    """Rows = each prompt of data.path (prompt ids, out of the loss) + the verifier's response (trained on)."""

    def token_rows(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.regenerate import regenerated_rows_dir
        from eagle3.device.choice import runtime_of

        return regenerated_rows_dir(self.data, verifier_dir, cfg.cache_dir, runtime_of(cfg).device())

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        return None

    def no_rows_reason(self) -> str:
        return f"the responses to the prompts of {self.data.path} are not counted before a run regenerates them"

    def plan_notes(self, run: TrainConfig) -> list[str]:
        """The expected regeneration time: the prompt rows of data.path x max_new_tokens at the tokens/s the last
        regeneration with this engine and verifier measured on this machine (eagle3.plan.roofline's cache)."""
        import os

        from eagle3.engine.venv import PYTHON_ENV, default_dir, has_cuda

        engine = self.data.regenerate.engine.value
        if engine == "auto":  # what with_engine will choose, from the environment's presence (no probe here)
            engine = "vllm" if os.environ.get(PYTHON_ENV) or (default_dir() / "bin" / "python").exists() else \
                "transformers"
        try:
            with open(self.data.path, "rb") as f:
                rows = sum(1 for line in f if line.strip())
        except OSError:
            return []
        tokens = rows * self.data.regenerate.max_new_tokens
        new = self.data.regenerate.max_new_tokens
        head = (f"regeneration (data=regenerate, engine {engine}): {rows:,} prompt rows x up to {new} new tokens = "
                f"up to {tokens:,} tokens (built once into cache_dir)")
        rate, where = None, ""
        verifier = None if run.model.verifier.path is None else Verifier(run.model.verifier.path)
        if verifier is not None and verifier.exists():
            from eagle3.plan.roofline import cached_rate, regeneration_key

            key = regeneration_key(engine, verifier.fingerprint()["config_hash"])
            rate, where = cached_rate(Path(run.cache_dir), "cuda" if has_cuda() else "cpu", key)
        if rate is None:
            return [f"{head}; no measured rate for this engine and verifier on this machine yet (a regeneration "
                    f"measures it)"]
        return [f"{head}: at most about {tokens / rate / 60:.1f} min at {rate:,.1f} tokens/s, measured by the last "
                f"regeneration here ({where})"]
