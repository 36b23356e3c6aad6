"""What one `eagle3 serve` measures (its options, eagle3/cli/serve.py) and each run as it is served."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ServeRequest:
    """The options of `eagle3 serve` (whose help says what each means), with its defaults; num_prompts,
    max_new_tokens, temperature and k checked as eval.accept's and eval.serve's."""
    runs: list[str]
    k: list[int] | None = None
    prompts: str | None = None
    num_prompts: int = 8
    max_new_tokens: int = 32
    temperature: float = 0.0
    dtype: str = "float32"
    port: int | None = None
    seed: int = 0
    no_ngram: bool = False
    ngram_min: int = 2
    ngram_max: int = 5
    python: str | None = None
    startup_timeout: float = 600.0


@dataclass
class ServedRun:
    """One run as the command serves it: its checkpoint, its prompts, and the report path of each k."""
    run_dir: Path
    checkpoint: Path
    verifier_dir: Path
    val_split: tuple[Path, float] | None
    outs: dict[int, Path]
    prompts: list = field(default_factory=list)
    source: str = ""
    trained_steps: int = 3  # the draft's ttt_steps (its config's speculative_tokens): the k it was trained for
    kind: str = "eagle3"    # the draft kind its config states (eagle3.init.checkpoint.draft_kind), read once
