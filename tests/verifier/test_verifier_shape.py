"""The verifier's shape, read from its config.json (eagle3.verifier.shape): model=auto and the presets take the
draft's shape from it, and a config no model could have, one the draft cannot mirror (a LayerNorm decoder, too few
layers, a missing size) or a verifier given the wrong way is one message where it is read."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from commands import launch
from eagle3.errors import ConfigError
from factories import compose_cfg, own_verifier, tiny_run_config, verifier_config_dir


def test_model_auto_reads_the_draft_shape_from_config_json(tmp_path):
    verifier = own_verifier(tmp_path / "verifier")
    draft = OmegaConf.to_container(compose_cfg(["model=auto", f"model.verifier.path={verifier}"]).model.draft,
                                   resolve=True)
    assert {k: draft[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                  "intermediate_size", "vocab_size", "draft_vocab_size", "aux_layer_ids",
                                  "max_position_embeddings", "rope_theta", "rms_norm_eps")} == {
        "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 160, "vocab_size": 800, "draft_vocab_size": 800, "aux_layer_ids": [2, 4, 5],
        "max_position_embeddings": 256, "rope_theta": 50000.0, "rms_norm_eps": 1e-5}
    # transformers 4's layout: rope_theta at the top, no head_dim; a large vocabulary gets a 32000-token draft one
    verifier_config_dir(tmp_path / "v4", hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                        intermediate_size=14336, vocab_size=128256, num_hidden_layers=32,
                        max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5)
    for model in ("auto", "llama3_8b"):
        draft = OmegaConf.to_container(compose_cfg([f"model={model}", f"model.verifier.path={tmp_path / 'v4'}"])
                                       .model.draft, resolve=True)
        assert (draft["head_dim"], draft["draft_vocab_size"], draft["aux_layer_ids"], draft["rope_theta"]) == (
            128, 32000, [2, 16, 29], 500000.0)


@pytest.mark.parametrize("args, says", [
    (["model=auto"], "model.verifier.path is required"),
    (["model=auto", "model.verifier.path=/nonexistent"], "/nonexistent has no config.json (model=auto reads"),
    (["data=offline", "data.path={data}", "model.verifier.path=/tmp"], "for your own verifier use model=auto"),
    (["model.verifier.path=/tmp", "model.verifier.tiny=null"], "for your own verifier use model=auto"),
])
def test_own_verifier_mistakes_get_one_message(args, says, tmp_path):
    (tmp_path / "ds" / "hidden_states").mkdir(parents=True)  # data.path passes its own check: only the model is wrong
    args = [a.format(data=tmp_path / "ds") for a in args]
    proc = launch([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path / "cache")
    assert proc.returncode == 1 and says in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


# A Llama-style decoder of 8 layers, hidden 64, as a config.json alone.
SMALL_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
               "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}


@pytest.mark.slow
def test_cfg_job_resolve_with_model_auto_says_what_the_verifier_config_lacks(cache_dir, tmp_path):
    for config, message in (({"hidden_size": None}, "config.json has no hidden_size"),
                            ({"num_hidden_layers": 2}, "the verifier has 2 layers, too few")):
        fields = {k: v for k, v in {**SMALL_LLAMA, **config}.items() if v is not None}  # None: the field left out
        verifier_dir = verifier_config_dir(tmp_path / message.split()[-1].replace(",", ""), **fields)
        proc = launch(["model=auto", f"model.verifier.path={verifier_dir}", "--cfg", "job", "--resolve"], cache_dir,
                      timeout=120)
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


# A Llama-style decoder config as transformers writes it (no weights: a plan and the config checks read no weights).
GOOD = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 96, "num_hidden_layers": 8,
        "num_attention_heads": 6, "num_key_value_heads": 2, "intermediate_size": 160, "vocab_size": 800,
        "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}


def run_cfg(overrides: list[str]):
    """The typed run config of these overrides with its verifier dir checked, as the launcher checks a new job before
    its plan (check_new_job), a resolution error said as the launcher says it (launch.resolve)."""
    from omegaconf.errors import InterpolationResolutionError

    from eagle3.verifier.shape import check_verifier_dir, unresolvable

    try:
        cfg = tiny_run_config(overrides)
    except InterpolationResolutionError as e:
        raise ConfigError(unresolvable(e)) from None
    check_verifier_dir(cfg.model)
    return cfg


def verifier_dir(path: Path, **changes) -> Path:
    return verifier_config_dir(path, **{**GOOD, **changes})


IMPOSSIBLE = [
    ({"hidden_size": -64}, "hidden_size=-64"),
    ({"num_key_value_heads": 8}, "num_key_value_heads=8 > num_attention_heads=6"),
    ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_attention_heads=4 is not a multiple of "
                                                           "num_key_value_heads=3"),
    ({"hidden_size": 100, "num_attention_heads": 7, "num_key_value_heads": 7}, "hidden_size=100 is not a multiple "
                                                                               "of num_attention_heads=7"),
    ({"max_position_embeddings": 0}, "max_position_embeddings=0"),
    ({"vocab_size": 80.5}, "vocab_size=80.5"),
]


@pytest.mark.parametrize("changes, says", IMPOSSIBLE, ids=[next(iter(c)) + str(i) for i, (c, _) in
                                                            enumerate(IMPOSSIBLE)])
def test_model_auto_refuses_a_verifier_config_no_model_could_have(changes, says, tmp_path):
    from eagle3.verifier.shape import verifier_config

    path = verifier_dir(tmp_path / "v", **changes)
    assert verifier_config(verifier_dir(tmp_path / "good"), "hidden_size") == 96
    with pytest.raises(ConfigError, match="no model could have") as refused:
        verifier_config(path, "hidden_size")
    assert says in str(refused.value) and str(path / "config.json") in str(refused.value)


@pytest.mark.parametrize("model", ["auto", "llama3_8b", "kimi_k25"])  # kimi_k25's draft is typed, not read
def test_every_model_option_refuses_it_before_a_plan(model, tmp_path):
    path = verifier_dir(tmp_path / "v", hidden_size=-64)
    with pytest.raises(ConfigError, match=r"^model\.verifier\.path: .*hidden_size=-64"):
        run_cfg([f"model={model}", f"model.verifier.path={path}"])


def test_a_tiny_verifier_or_a_draft_no_model_could_have_is_refused():
    with pytest.raises(ConfigError, match=r"model\.verifier\.tiny: .*hidden_size=100 is not a multiple of num_heads=7"):
        tiny_run_config(["model.verifier.tiny.hidden_size=100", "model.verifier.tiny.num_heads=7"])
    with pytest.raises(ConfigError, match=r"model\.verifier\.tiny: .*hidden_size=-64"):
        tiny_run_config(["model.verifier.tiny.hidden_size=-64"])
    with pytest.raises(ConfigError, match=r"model\.draft: .*num_key_value_heads=8 > num_attention_heads=4"):
        tiny_run_config(["model.draft.num_key_value_heads=8"])
    with pytest.raises(ConfigError, match=r"model\.draft: .*max_position_embeddings=0"):
        tiny_run_config(["model.draft.max_position_embeddings=0"])
    assert tiny_run_config([]).model.draft.hidden_size == 128  # the default is none of these


def test_every_reader_of_a_verifiers_sizes_takes_a_multimodal_wrappers_text_config(tmp_path):
    """Kimi-K2.5 and Qwen3-VL nest the decoder under text_config: the shape reader, the data's fingerprint, the online
    rows' position bound, regeneration's end-of-sequence ids and the export's parity check all read it there."""
    from eagle3.serve.export import read_verifier
    from eagle3.verifier.model import Verifier

    text = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256, "eos_token_id": 7,
            "rms_norm_eps": 1e-5}
    verifier = verifier_config_dir(tmp_path / "wrapped", model_type="kimi_k25", text_config=text,
                                   vision_config={"hidden_size": 1152})
    assert Verifier(verifier).config == text and read_verifier(verifier) == text
    fingerprint = Verifier(verifier).fingerprint()
    assert (fingerprint["hidden_size"], fingerprint["num_hidden_layers"], fingerprint["model_type"]) == (64, 4,
                                                                                                         "kimi_k25")
    assert Verifier(verifier).positions == 256 and Verifier(verifier).eos_ids() == [7]


def test_a_layernorm_verifier_is_refused_naming_the_norm(tmp_path):
    from transformers import StableLmConfig

    from eagle3.verifier.shape import verifier_config

    stablelm = tmp_path / "stablelm"
    StableLmConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=8, num_attention_heads=4,
                   num_key_value_heads=2, vocab_size=500, max_position_embeddings=256).save_pretrained(str(stablelm))
    with pytest.raises(ConfigError, match="LayerNorm") as refused:
        verifier_config(stablelm, "hidden_size")
    assert "layer_norm_eps" in str(refused.value) and "'stablelm'" in str(refused.value)
    # model=auto with the missing rms_norm_eps given by hand, and a fixed model option: refused as well.
    for overrides in (["model=auto", "model.draft.rms_norm_eps=1e-5"], ["model=kimi_k25"]):
        with pytest.raises(ConfigError, match="^model.verifier.path: .*LayerNorm"):
            run_cfg([*overrides, f"model.verifier.path={stablelm}"])
