"""Experiment presets: the seed runs compose with their deltas and build at full size on the meta device."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from commands import launch
from eagle3.arch.draft import resolved_flags
from eagle3.config import SPECULATORS_FLAGS, DraftConfig, validate
from eagle3.init.build import meta_draft
from eagle3.init.pretrained import SPECFORGE_FLAGS
from factories import CONF, compose_cfg, verifier_config_dir

PATHS = ["model.verifier.path=/models/Kimi-K2.5", "data.path=/data/k25"]
# SmolLM2-135M-Instruct's shape (its config.json), for experiment=smollm2_sharegpt without the reference assets built
SMOLLM2_SHAPE = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_attention_heads": 9,
                 "num_key_value_heads": 3, "num_hidden_layers": 30, "vocab_size": 49152, "head_dim": 64,
                 "max_position_embeddings": 8192, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
                 "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": True}
EXPERIMENTS = sorted(str(p.relative_to(CONF / "experiment").with_suffix(""))
                     for p in (CONF / "experiment").rglob("*.yaml"))


def resolved(overrides: list[str]) -> dict:
    return OmegaConf.to_container(compose_cfg(overrides), resolve=True, throw_on_missing=True, enum_to_str=True)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_composes_and_validates(name, tmp_path):
    paths = []
    if name.startswith("kimi"):  # the verifier and data a user points it at
        (tmp_path / "data" / "hidden_states").mkdir(parents=True)
        verifier_config_dir(tmp_path / "verifier")
        paths = [f"model.verifier.path={tmp_path / 'verifier'}", f"data.path={tmp_path / 'data'}"]
    if name == "smollm2_sharegpt":  # its verifier and data under cache_dir, as python -m eagle3.reference builds them
        verifier_config_dir(tmp_path / "reference" / "SmolLM2-135M-Instruct", **SMOLLM2_SHAPE)
        (tmp_path / "reference" / "sharegpt").mkdir()
        (tmp_path / "reference" / "sharegpt" / "ShareGPT_V3_unfiltered_cleaned_split.json").write_text(
            json.dumps([{"id": "a_0", "conversations": [{"from": "human", "value": "Hi"},
                                                        {"from": "gpt", "value": "Hello"}]}]))
        paths = [f"cache_dir={tmp_path}"]
    cfg = resolved([f"experiment={name}", *paths])
    validate(cfg)
    # The preset's own values win over the defaults of the groups it chooses (Hydra's composition order).
    for key, value in preset_values(name).items():
        assert OmegaConf.select(OmegaConf.create(cfg), key) == value, key


def preset_values(name: str) -> dict:
    """The dotted keys and values an experiment file (and the preset it extends) sets itself, beside `defaults`;
    read with OmegaConf's YAML loader, as Hydra reads it (1e-5 is a float there), interpolations left out."""
    text = OmegaConf.to_container(OmegaConf.load(CONF / "experiment" / f"{name}.yaml"), resolve=False)
    values = {}
    for entry in text.get("defaults", []):
        if isinstance(entry, str) and entry.startswith("/experiment/"):  # a base preset
            values.update(preset_values(entry.removeprefix("/experiment/")))

    def walk(node: dict, prefix: str) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(value, f"{prefix}{key}.")
            elif not (isinstance(value, str) and "${" in value):
                values[f"{prefix}{key}"] = value
    walk({k: v for k, v in text.items() if k != "defaults"}, "")
    return values


def draft_parameters(draft: DraftConfig, flags: dict) -> int:
    """Parameters of the draft besides embed_tokens and the (frozen, vocabulary-sized) heads."""
    model = meta_draft(draft, flags)
    assert next(model.parameters()).device.type == "meta"
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("embed", "verifier", "lm_head")))


def kimi_formula(input_norm: bool) -> int:
    h, attn, inter = 7168, 64 * 128, 18432
    return 3 * h * h + 3 * attn * 2 * h + h * attn + 3 * h * inter + 4 * h + (3 * h if input_norm else 0)


def test_kimi_k25_scratch_preset():
    cfg = resolved(["experiment=kimi_k25_scratch", *PATHS])
    assert cfg["init"]["recommended_lr"][0] <= cfg["optim"]["lr"] <= cfg["init"]["recommended_lr"][1]
    draft = DraftConfig(**cfg["model"]["draft"])
    count = draft_parameters(draft, resolved_flags(draft, SPECULATORS_FLAGS))
    print(f"\nkimi_k25_scratch draft: {count:,} parameters besides embed_tokens and lm_head")
    assert count == kimi_formula(input_norm=True)


def test_kimi_k25_finetune_k2_preset():
    cfg = resolved(["experiment=kimi_k25_finetune_k2", *PATHS])
    assert cfg["init"]["name"] == "pretrained" and cfg["init"]["vocab"] == "remap"
    assert cfg["optim"]["lr"] < 3e-5  # below the scratch run's lr
    assert cfg["init"]["recommended_lr"][0] <= cfg["optim"]["lr"] <= cfg["init"]["recommended_lr"][1]
    draft = DraftConfig(**cfg["model"]["draft"])
    count = draft_parameters(draft, resolved_flags(draft, SPECFORGE_FLAGS))
    print(f"\nkimi_k25_finetune_k2 draft (SpecForge layout flags): {count:,} parameters besides embed_tokens "
          "and lm_head")
    assert count == kimi_formula(input_norm=False)


@pytest.mark.parametrize("extra", [[], ["--cfg", "job"]])
def test_unknown_experiment_is_refused_with_the_list(extra, tmp_path):
    proc = launch(["experiment=kimi_k25_scrach", f"hydra.run.dir={tmp_path / 'run'}", *extra], tmp_path / "cache")
    assert proc.returncode != 0
    assert "experiment/kimi_k25_scrach" in proc.stderr
    assert "kimi_k25_scratch" in proc.stderr and "kimi_k25_finetune_k2" in proc.stderr  # the ones that exist
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing trained
