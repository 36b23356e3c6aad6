"""The draft carries the verifier's RoPE: model=auto reads it from either config schema, the built draft rotates
as the verifier does, init=pretrained states a checkpoint's differing RoPE, and the export writes it where vLLM
and SGLang read it."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from factories import compose_cfg, verifier_config_dir, verifier_dir

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}


def scaled_verifier(path, scaling: dict, theta: float = 500000.0):
    """A tiny Llama verifier (8 layers, hidden 64, vocab 256) with RoPE scaling, saved as a Hugging Face dir."""
    return verifier_dir(path, hidden_size=64, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
                        rope_parameters={"rope_theta": theta, **scaling})


def auto_draft(verifier, *overrides):
    from eagle3.config import DraftConfig

    plain = OmegaConf.to_container(compose_cfg(["model=auto", f"model.verifier.path={verifier}", *overrides])
                                   .model.draft, resolve=True)
    return DraftConfig(**plain)


def rotation(config) -> tuple[torch.Tensor, float]:
    """The inverse frequencies and attention scaling transformers derives from a (draft or verifier) config."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config)
    return rotary.inv_freq, rotary.attention_scaling


@pytest.mark.parametrize("scaling", [LLAMA3, YARN], ids=["llama3", "yarn"])
def test_model_auto_draft_rotates_as_its_verifier(tmp_path, scaling):
    from transformers import AutoConfig

    from eagle3.init.build import draft_layer_config

    verifier = scaled_verifier(tmp_path / "v", scaling)
    draft = auto_draft(verifier)
    assert (draft.rope_theta, draft.rope_scaling, draft.partial_rotary_factor) == (500000.0, scaling, 1.0)
    ours, theirs = rotation(draft_layer_config(draft, "sdpa")), rotation(AutoConfig.from_pretrained(verifier))
    assert torch.equal(ours[0], theirs[0]) and ours[1] == theirs[1]
    default = rotation(draft_layer_config(auto_draft(verifier, "model.draft.rope_scaling=null"), "sdpa"))
    assert not torch.equal(default[0], theirs[0])  # the scaling matters: default RoPE rotates otherwise


def test_llama3_8b_preset_keeps_a_transformers4_configs_scaling(tmp_path):
    verifier_config_dir(tmp_path / "v4", hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=14336, vocab_size=128256, num_hidden_layers=32,
                        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5,
                        rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                      "original_max_position_embeddings": 8192, "rope_type": "llama3"})
    plain = OmegaConf.to_container(compose_cfg(["model=llama3_8b", f"model.verifier.path={tmp_path / 'v4'}"])
                                   .model.draft, resolve=True)
    assert plain["rope_scaling"] == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    assert (plain["rope_theta"], plain["partial_rotary_factor"]) == (500000.0, 1.0)


def test_a_partial_rotary_verifier_is_refused_until_the_draft_rotates_whole_heads(tmp_path):
    """transformers' Llama layer ignores partial_rotary_factor for default RoPE, vLLM and SGLang do not: a draft
    trained with it would be served with another rotation. The verifier's value is carried, and refused."""

    verifier_config_dir(tmp_path / "v", hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, vocab_size=256, num_hidden_layers=8, max_position_embeddings=256,
                        rms_norm_eps=1e-5, rope_theta=10000.0, partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match=r"partial_rotary_factor: is 0.5 .*set model.draft.partial_rotary_factor=1.0"):
        auto_draft(tmp_path / "v").check()
    assert auto_draft(tmp_path / "v", "model.draft.partial_rotary_factor=1.0").partial_rotary_factor == 1.0


def test_a_rope_per_layer_type_is_one_message(tmp_path):
    from eagle3.errors import ConfigError
    from eagle3.verifier.shape import verifier_config

    verifier_config_dir(tmp_path, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})
    with pytest.raises(ConfigError, match="RoPE per layer type .*set model.draft.rope_theta"):
        verifier_config(tmp_path, "rope_theta")


def pretrained_context(draft, path, overrides=()):
    from eagle3.config import PretrainedInitConfig
    from eagle3.init import InitContext

    return InitContext(draft=draft, init=PretrainedInitConfig(path=str(path)), verifier_dir=path, data_dir=path,
                       attn_impl="sdpa", overrides=list(overrides))


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
def test_pretrained_drafter_with_another_rope_is_a_stated_difference(tmp_path, fmt):
    """A drafter trained with llama3 scaling, loaded into a run whose draft has default RoPE: refused, named,
    unless the run's RoPE is set on the command line (then noted); the same RoPE loads without a word."""
    from dataclasses import replace

    from eagle3.config import DraftConfig
    from eagle3.init.build import bare_draft
    from eagle3.init.files import CheckpointError
    from eagle3.init.pretrained import SPECFORGE_FLAGS, read_source, resolve_architecture
    from eagle3.serve.export import export

    scaled = DraftConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                         num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=500000.0,
                         rope_scaling=LLAMA3, draft_vocab_size=48, aux_layer_ids=[1, 2, 3])
    bare_draft(scaled, SPECFORGE_FLAGS, "cpu").save_pretrained(str(tmp_path / "speculators"))
    if fmt == "specforge":
        export(tmp_path / "speculators", tmp_path / "specforge", "specforge")
    source = read_source(tmp_path / fmt, {"midlayer.": "layers.0."})
    default = replace(scaled, rope_scaling=None)
    with pytest.raises(CheckpointError, match=r"RoPE: the run says rope_theta=500000, default RoPE, .* the "
                                              r"checkpoint rope_theta=500000, rope_type=llama3, factor=8"):
        resolve_architecture(pretrained_context(default, tmp_path), source)
    _, notes = resolve_architecture(pretrained_context(default, tmp_path, ["model.draft.rope_scaling=null"]), source)
    assert any(n.startswith("RoPE (rope_theta=500000, default RoPE") and "the checkpoint has" in n for n in notes)
    _, notes = resolve_architecture(pretrained_context(scaled, tmp_path), source)
    assert not any("RoPE" in n for n in notes)


def test_cfg_job_resolve_shows_the_verifiers_scaling(tmp_path):
    """`launch.py --cfg job --resolve` resolves the config in place (OmegaConf.resolve): a dict must fit there."""
    verifier_config_dir(tmp_path, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                        vocab_size=256, num_hidden_layers=8, max_position_embeddings=256, rms_norm_eps=1e-5,
                        rope_theta=500000.0, rope_scaling=YARN)
    cfg = compose_cfg(["model=auto", f"model.verifier.path={tmp_path}"])
    OmegaConf.resolve(cfg)
    assert OmegaConf.to_container(cfg.model.draft.rope_scaling) == YARN and cfg.model.draft.rope_theta == 500000.0
