"""data=regenerate: a prompt set's responses written anew by the verifier itself (eagle3/data/regenerate.py), then
trained on as data=online trains on token rows: the verifier computes their hidden states in the loop. The rows
are built once into cache_dir, keyed by the prompts' bytes, the verifier and `data.regenerate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import MISSING

from eagle3.config import (
    ROWS_FILES,
    BadSamplePolicy,
    DraftConfig,
    _require,
    _rows_path_problem,
    require_temperature,
)
from eagle3.data.sources.online import TokenRows
from eagle3.data.sources.registry import register

if TYPE_CHECKING:
    from eagle3.config import RunConfig, TrainConfig
    from eagle3.plan.memory import DataStats


class RegenerationEngine(str, Enum):
    auto = "auto"                   # vllm when its engine environment is there, else transformers (the log says which)
    transformers = "transformers"   # the verifier in this process: transformers' batched, KV-cached generate
    vllm = "vllm"                   # the verifier served by vLLM (python -m eagle3.serve --install builds its venv)


@dataclass
class Regeneration:
    """How the responses are regenerated (the settings the cached rows are keyed by)."""

    temperature: float = 0.0     # 0: greedy; above: sampled at this temperature from the full distribution
    max_new_tokens: int = 256    # tokens per response at most (fewer where the verifier's positions end)
    seed: int = 0                # with the prompt's index, seeds each prompt's draws (temperature > 0)
    batch_size: int = 16         # prompts per batched generation, and per chunk saved (a stopped run resumes there)
    engine: RegenerationEngine = RegenerationEngine.auto

    def check(self) -> None:
        for key in ("max_new_tokens", "batch_size"):
            value = getattr(self, key)
            _require(value >= 1, f"data.regenerate.{key}", f"must be >= 1, got {value}")
        require_temperature("data.regenerate.temperature", self.temperature)


@register
@dataclass
class RegenerateDataConfig(TokenRows):
    """Rows = each prompt of data.path (prompt ids, out of the loss) + the verifier's response (trained on)."""

    name: str = "regenerate"
    # The prompt set, in any file data=online reads: conversations ({"messages"}, ShareGPT's {"conversations"};
    # rendered with the verifier's chat template; every assistant turn, and a last user turn, is a response to
    # regenerate) or {"input_ids", "loss_mask"} rows (every span of loss mask 1 is a response to regenerate; the
    # tokens before it are its prompt)
    path: str = MISSING
    regenerate: Regeneration = field(default_factory=Regeneration)

    def check(self, run: TrainConfig, dataset_required: bool = True) -> None:
        super().check(run, dataset_required)
        self.regenerate.check()
        if dataset_required:
            problem = _rows_path_problem(Path(self.path), self.on_bad_sample == BadSamplePolicy.error)
            _require(problem is None, "data.path", f"{self.path} {problem}; data=regenerate reads a prompt set: "
                                                   f"{ROWS_FILES}")

    def token_rows(self, cfg: RunConfig, verifier_dir: Path) -> Path:
        from eagle3.data.regenerate import regenerated_rows_dir
        from eagle3.device.choice import runtime_of

        return regenerated_rows_dir(Path(self.path), verifier_dir, self.regenerate, cfg.cache_dir,
                                    self.on_bad_sample.value, runtime_of(cfg).device(), self.format,
                                    self.max_records)

    def plan_stats(self, draft: DraftConfig) -> DataStats | None:
        return None

    def no_rows_reason(self) -> str:
        return f"the responses to the prompts of {self.path} are not counted before a run regenerates them"

    def plan_notes(self, run: TrainConfig) -> list[str]:
        """The expected regeneration time: the prompt rows of data.path x max_new_tokens at the tokens/s the last
        regeneration with this engine and verifier measured on this machine (eagle3.plan.roofline's cache)."""
        import os

        from eagle3.engine.venv import PYTHON_ENV, default_dir, has_cuda

        engine = self.regenerate.engine.value
        if engine == "auto":  # what with_engine will choose, from the environment's presence (no probe here)
            engine = "vllm" if os.environ.get(PYTHON_ENV) or (default_dir() / "bin" / "python").exists() else \
                "transformers"
        try:
            with open(self.path, "rb") as f:
                rows = sum(1 for line in f if line.strip())
        except OSError:
            return []
        tokens = rows * self.regenerate.max_new_tokens
        head = (f"regeneration (data=regenerate, engine {engine}): {rows:,} prompt rows x up to "
                f"{self.regenerate.max_new_tokens} new tokens = up to {tokens:,} tokens (built once into cache_dir)")
        rate, where = None, ""
        if run.model.verifier.path is not None and (Path(run.model.verifier.path) / "config.json").is_file():
            from eagle3.data.record import verifier_fingerprint
            from eagle3.plan.roofline import cached_rate, regeneration_key

            key = regeneration_key(engine, verifier_fingerprint(run.model.verifier.path)["config_hash"])
            rate, where = cached_rate(Path(run.cache_dir), "cuda" if has_cuda() else "cpu", key)
        if rate is None:
            return [f"{head}; no measured rate for this engine and verifier on this machine yet (a regeneration "
                    f"measures it)"]
        return [f"{head}: at most about {tokens / rate / 60:.1f} min at {rate:,.1f} tokens/s, measured by the last "
                f"regeneration here ({where})"]
