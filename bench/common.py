"""Shared by the benchmarks: the tiny default run's config, inputs and draft, built as the launcher builds them."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eagle3.config import DraftConfig, RunConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def tiny_run_config(overrides: list[str] | None = None) -> RunConfig:
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from eagle3.config import register_configs, run_config
    from eagle3.verifier.shape import register_resolvers

    register_configs()
    register_resolvers()
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(config_name="train", overrides=["logger.mode=disabled", *(overrides or [])])
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(resolved, dict)
    resolved["run"] = {"dir": "", "name": "bench", "group": "bench", "choices": {}, "overrides": []}
    return run_config(resolved)


def random_draft(draft: DraftConfig, attn_impl: str, std: float, seed: int = 0):
    """A real Eagle3DraftModel of `draft` on CPU with random weights (normal(0, `std`) for the embedding and the
    two heads), a random draft vocabulary and the verifier's norm as 1: what training holds, with no data."""
    import torch

    from eagle3.config import SPECULATORS_FLAGS
    from eagle3.init.build import bare_draft

    torch.manual_seed(seed)
    model = bare_draft(draft, SPECULATORS_FLAGS, "cpu", attn_impl=attn_impl)
    ids = torch.sort(torch.randperm(draft.vocab_size)[: draft.draft_vocab_size]).values
    t2d = torch.zeros(draft.vocab_size, dtype=torch.bool)
    t2d[ids] = True
    model.load_vocab_mappings(t2d, ids - torch.arange(len(ids)))
    with torch.no_grad():
        for p in (model.embed_tokens.weight, model.lm_head.weight, model.verifier_lm_head.weight):
            p.normal_(0, std)
        model.verifier_norm.weight.fill_(1.0)
    return model
