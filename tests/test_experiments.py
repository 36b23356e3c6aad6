"""Experiment presets: the seed runs compose with their deltas and build at full size on the meta device."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import CONF, compose_cfg
from eagle3.config import validate
from eagle3.init.build import SPECULATORS_FLAGS, meta_draft, resolved_flags
from eagle3.init.pretrained import SPECFORGE_FLAGS

PATHS = ["model.verifier.path=/models/Kimi-K2.5", "data.path=/data/k25"]
EXPERIMENTS = sorted(str(p.relative_to(CONF / "experiment").with_suffix(""))
                     for p in (CONF / "experiment").rglob("*.yaml"))


def resolved(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose_cfg(overrides), resolve=True, throw_on_missing=True, enum_to_str=True)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name, tmp_path):
    paths = []
    if name.startswith("kimi"):  # the verifier and data a user points it at
        (tmp_path / "data" / "hidden_states").mkdir(parents=True)
        (tmp_path / "verifier").mkdir()
        (tmp_path / "verifier" / "config.json").write_text("{}")
        paths = [f"model.verifier.path={tmp_path / 'verifier'}", f"data.path={tmp_path / 'data'}"]
    validate(resolved([f"experiment={name}", *paths]))


def draft_parameters(draft: dict, flags: dict) -> int:
    """Parameters of the draft besides embed_tokens and the (frozen, vocabulary-sized) heads."""
    model = meta_draft(draft, flags)
    assert next(model.parameters()).device.type == "meta"
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("embed", "verifier", "lm_head")))


def kimi_formula(input_norm: bool) -> int:
    h, attn, inter = 7168, 64 * 128, 18432
    return 3 * h * h + 3 * attn * 2 * h + h * attn + 3 * h * inter + 4 * h + (3 * h if input_norm else 0)


def test_kimi_k25_scratch_preset():
    cfg = resolved(["experiment=kimi_k25_scratch", *PATHS])
    assert cfg["optim"]["lr"] == 3e-5 and cfg["optim"]["epochs"] == 5 and cfg["optim"]["warmup_ratio"] == 0.03
    assert cfg["optim"]["scheduler"] == "cosine" and cfg["distributed"]["nproc_per_node"] == 8
    assert cfg["distributed"]["strategy"] == "ddp" and cfg["init"]["name"] == "scratch"
    count = draft_parameters(cfg["model"]["draft"], resolved_flags(cfg["model"]["draft"], SPECULATORS_FLAGS))
    print(f"\nkimi_k25_scratch draft: {count:,} parameters besides embed_tokens and lm_head")
    assert count == kimi_formula(input_norm=True)


def test_kimi_k25_finetune_k2_preset():
    cfg = resolved(["experiment=kimi_k25_finetune_k2", *PATHS])
    assert cfg["init"]["name"] == "pretrained" and cfg["init"]["vocab"] == "remap"
    assert cfg["optim"]["lr"] < 3e-5  # below the scratch run's lr
    assert cfg["init"]["recommended_lr"][0] <= cfg["optim"]["lr"] <= cfg["init"]["recommended_lr"][1]
    count = draft_parameters(cfg["model"]["draft"], resolved_flags(cfg["model"]["draft"], SPECFORGE_FLAGS))
    print(f"\nkimi_k25_finetune_k2 draft (SpecForge layout flags): {count:,} parameters besides embed_tokens "
          "and lm_head")
    assert count == kimi_formula(input_norm=False)
