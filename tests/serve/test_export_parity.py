"""Serve parity at export: each engine's rule (eagle3/serve/parity.py) refuses or warns on a checkpoint that
breaks it, and what the export writes is what vLLM and SGLang read as the draft was trained."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load_file, save_file

from commands import exit_status_of
from eagle3.cli.export import main
from factories import verifier_config_dir, verifier_dir

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}


@pytest.fixture(scope="module")
def verifier(tmp_path_factory):
    """A tiny Llama verifier (6 layers, hidden 32, vocab 64, llama3 RoPE scaling), saved with its weights."""
    return verifier_dir(tmp_path_factory.mktemp("verifier") / "llama", hidden_size=32, num_hidden_layers=6,
                        num_attention_heads=2, num_key_value_heads=2, head_dim=16, intermediate_size=64, vocab_size=64,
                        max_position_embeddings=128, rope_parameters={"rope_theta": 500000.0, **LLAMA3})


@pytest.fixture(scope="module")
def good(verifier, tmp_path_factory):
    """A speculators checkpoint of a draft for `verifier`: its RoPE, its embed_tokens, SpecForge's norm flags (so
    that both engines can serve it), naming the verifier by its absolute path as a training run does."""
    from eagle3.config import DraftConfig
    from eagle3.init.build import bare_draft
    from eagle3.init.pretrained import SPECFORGE_FLAGS

    draft = DraftConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=500000.0,
                        draft_vocab_size=48, aux_layer_ids=[1, 2, 3])
    path = tmp_path_factory.mktemp("ckpt") / "best"
    bare_draft(draft, SPECFORGE_FLAGS, "cpu").save_pretrained(str(path))
    tensors = load_file(str(path / "model.safetensors"))
    tensors["embed_tokens.weight"] = load_file(str(verifier / "model.safetensors"))["model.embed_tokens.weight"]
    tensors["t2d"] = torch.arange(64) < 48
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})
    edit_config(path, lambda c: c["speculators_config"]["verifier"].update(name_or_path=str(verifier)))
    edit_config(path, lambda c: c["transformer_layer_config"].update(rope_parameters={"rope_theta": 500000.0,
                                                                                       **LLAMA3}))
    return path


def edit_config(path, edit):
    config = json.loads((path / "config.json").read_text())
    edit(config)
    (path / "config.json").write_text(json.dumps(config))


def broken(good, tmp_path, config=None, tensors=None):
    copy = tmp_path / "ckpt"
    shutil.copytree(good, copy)
    if config:
        edit_config(copy, config)
    if tensors:
        file = copy / "model.safetensors"
        save_file(tensors(load_file(str(file))), str(file), metadata={"format": "pt"})
    return copy


def run(checkpoint, tmp_path, capsys, *args):
    out = tmp_path / "out"
    code = exit_status_of(main, [str(checkpoint), "--out", str(out), *args])
    err = capsys.readouterr().err
    assert (code == 0) == out.exists(), err  # a refusal writes nothing
    return code, err, (json.loads((out / "config.json").read_text()) if code == 0 else None)


def test_a_good_checkpoint_exports_to_both_engines_with_rope_in_every_schema(good, verifier, tmp_path, capsys):
    code, err, config = run(good, tmp_path / "s", capsys)
    assert code == 0 and "warning: vllm, verifier: speculators_config.verifier.name_or_path=" in err, err
    assert err.count("warning:") == 1, err
    layer = config["transformer_layer_config"]
    assert layer["rope_parameters"] == {"rope_theta": 500000.0, **LLAMA3}
    assert layer["rope_scaling"] == LLAMA3 and layer["rope_theta"] == 500000.0
    assert layer["partial_rotary_factor"] == 1.0
    code, err, config = run(good, tmp_path / "f", capsys, "--format", "specforge")
    assert code == 0 and "warning" not in err, err
    assert (config["rope_theta"], config["partial_rotary_factor"]) == (500000.0, 1.0)  # SGLang reads them here
    assert config["rope_parameters"] == {"rope_theta": 500000.0, **LLAMA3}
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # SGLang captures id + 1


def test_verifier_option_writes_the_id_vllm_loads(good, tmp_path, capsys):
    code, err, config = run(good, tmp_path, capsys, "--verifier", "meta-llama/Llama-3.1-8B-Instruct")
    assert code == 0 and config["speculators_config"]["verifier"]["name_or_path"] == \
        "meta-llama/Llama-3.1-8B-Instruct"
    assert "absolute path" not in err and "warning" not in err  # checked against the training machine's verifier
    elsewhere = broken(good, tmp_path, config=lambda c: c["speculators_config"]["verifier"].update(
        name_or_path="/moved/away"))
    code, err, _ = run(elsewhere, tmp_path / "moved", capsys, "--verifier", "meta-llama/Llama-3.1-8B-Instruct")
    assert code == 0 and "the verifier's config.json is not here" in err, err


def test_norm_before_residual_true_is_refused_for_sglang_only(good, tmp_path, capsys):
    ckpt = broken(good, tmp_path, config=lambda c: c.update(norm_before_residual=True))
    code, err, _ = run(ckpt, tmp_path / "f", capsys, "--format", "specforge")
    assert code == 1 and "sglang, norm flags: norm_before_residual=true" in err, err
    assert run(ckpt, tmp_path / "s", capsys)[0] == 0


def test_missing_norm_flags_are_written_as_speculators_read_them(good, tmp_path, capsys):
    """vLLM reads a missing norm_before_residual as true; speculators built the draft with false."""
    ckpt = broken(good, tmp_path, config=lambda c: [c.pop(k) for k in ("norm_before_residual", "norm_output")])
    code, _, config = run(ckpt, tmp_path, capsys)
    assert code == 0 and (config["norm_before_residual"], config["norm_output"]) == (False, False)


def test_tied_embeddings_are_written_untied(good, tmp_path, capsys):
    ckpt = broken(good, tmp_path, config=lambda c: c["transformer_layer_config"].update(tie_word_embeddings=True))
    code, _, config = run(ckpt, tmp_path, capsys)
    assert code == 0 and config["transformer_layer_config"]["tie_word_embeddings"] is False


def test_sglang_aux_offset_follows_the_target_and_refuses_what_it_cannot_express(good, tmp_path, capsys):
    """A Kimi/DeepSeek target: SGLang adds 1 only when the first id is 1, so trained [1, 2, 3] has no
    SpecForge spelling, and trained [2, 3, 4] is written [1, 2, 3]."""
    deepseek = verifier_config_dir(tmp_path / "deepseek", model_type="deepseek_v3", vocab_size=64,
                                   max_position_embeddings=128)
    code, err, _ = run(good, tmp_path / "a", capsys, "--format", "specforge", "--verifier", str(deepseek))
    assert code == 1 and "sglang, aux layers: eagle_config ids [0, 1, 2]: SGLang captures [0, 1, 2]" in err, err
    ckpt = broken(good, tmp_path, config=lambda c: c.update(eagle_aux_hidden_state_layer_ids=[2, 3, 4]))
    code, err, config = run(ckpt, tmp_path / "b", capsys, "--format", "specforge", "--verifier", str(deepseek))
    assert code == 0 and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3], err
    # no verifier dir here: the target's type comes from the architectures the checkpoint names
    named = broken(ckpt, tmp_path / "named", config=lambda c: c["speculators_config"].update(
        verifier={"name_or_path": "moonshotai/Kimi-K2.5", "architectures": ["DeepseekV3ForCausalLM"]}))
    code, err, config = run(named, tmp_path / "c", capsys, "--format", "specforge")
    assert code == 0 and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3], err


def test_unstated_aux_layers_are_refused(good, tmp_path, capsys):
    ckpt = broken(good, tmp_path, config=lambda c: c.pop("eagle_aux_hidden_state_layer_ids"))
    code, err, _ = run(ckpt, tmp_path, capsys)
    assert code == 1 and "does not state eagle_aux_hidden_state_layer_ids" in err, err


def test_embed_tokens_other_than_the_verifiers_is_refused_for_vllm(good, tmp_path, capsys):
    ckpt = broken(good, tmp_path, tensors=lambda t: t | {"embed_tokens.weight": t["embed_tokens.weight"] + 1})
    code, err, _ = run(ckpt, tmp_path, capsys)
    assert code == 1 and "vllm, embed_tokens: embed_tokens differs from the verifier's" in err, err


@pytest.mark.parametrize("d2t, says", [
    (lambda d: d.int(), "d2t I32 [48]: the engine needs int64"),
    (lambda d: torch.cat([d[:1], d[:-1]]) + torch.tensor([0] + [-1] * 47), "d2t: the target ids i + d2t[i] are not"),
    (lambda d: d + 20, "d2t: the target ids i + d2t[i] are not ascending, unique and in [0, 64)"),
], ids=["int32", "repeated", "beyond_vocab"])
def test_a_bad_d2t_is_refused_by_both_engines(good, tmp_path, capsys, d2t, says):
    ckpt = broken(good, tmp_path, tensors=lambda t: t | {"d2t": d2t(t["d2t"])})
    for fmt in ("speculators", "specforge"):
        code, err, _ = run(ckpt, tmp_path / fmt, capsys, "--format", fmt)
        assert code == 1 and "vocabulary: " + says in err.replace("sglang, ", "").replace("vllm, ", ""), err


def test_another_vocabulary_than_the_verifiers_is_refused(good, tmp_path, capsys):
    other = verifier_config_dir(tmp_path / "other", model_type="llama", vocab_size=80, max_position_embeddings=128)
    code, err, _ = run(good, tmp_path, capsys, "--verifier", str(other))
    assert code == 1 and "vocab_size=64, the verifier's 80" in err, err


def test_rope_and_positions_other_than_the_verifiers_are_warned(good, tmp_path, capsys):
    longer = verifier_config_dir(tmp_path / "longer", model_type="llama", vocab_size=64, rope_theta=1e6,
                                 max_position_embeddings=4096)
    code, err, _ = run(good, tmp_path, capsys, "--verifier", str(longer))
    assert code == 0 and "vllm, rope: the draft was trained with rope_theta=500000" in err, err
    assert "max_position_embeddings=128 < the verifier's 4096: raises it to the verifier's" in err
    code, err, _ = run(good, tmp_path / "f", capsys, "--format", "specforge", "--verifier", str(longer))
    assert code == 0 and "sglang, positions: max_position_embeddings=128 < the verifier's 4096: uses it as is" in err


# Rules a checkpoint cannot break once it passes the export's own checks (its tensors fit its config.json, its
# model type is eagle3): each is broken in the export's plan itself, as a regression in the export would.

def plan(good, fmt):
    from eagle3.init.files import checkpoint_files, read_config
    from eagle3.serve.export import planned

    return planned(good, checkpoint_files(good, "checkpoint"), read_config(good), fmt, None)[0]


def drop(key):
    return lambda s: replace(s, tensors={k: v for k, v in s.tensors.items() if k != key})


def set_config(**kv):
    return lambda s: replace(s, config={**s.config, **kv})


def add(key):
    return lambda s: replace(s, tensors={**s.tensors, key: s.tensors["norm.weight"]})


def set_layer(**kv):
    return lambda s: replace(s, layer={**s.layer, **kv})


@pytest.mark.parametrize("engine, fmt, edit, says", [
    ("vllm", "speculators", set_config(speculators_model_type="eagle"), "vllm, architecture:"),
    ("sglang", "specforge", set_config(architectures=["LlamaForCausalLM"]), "sglang, architecture:"),
    ("vllm", "speculators", set_config(speculators_config={"proposal_methods": [{}], "algorithm": "eagle3"}),
     "vllm, proposal:"),
    ("vllm", "speculators", set_layer(model_type="mistral"), "vllm, decoder:"),
    ("vllm", "speculators", set_config(norm_output=None), "vllm, norm flags: norm_output not stated"),
    ("vllm", "speculators", set_config(eagle_aux_hidden_state_layer_ids=[0, 1, 2]), "vllm, aux layers:"),
    ("sglang", "specforge", set_config(eagle_config={}), "sglang, aux layers: eagle_config"),
    ("sglang", "specforge", set_config(eagle_config={"eagle_aux_hidden_state_layer_ids": [0, 1]}), "fc width"),
    ("vllm", "speculators", drop("lm_head.weight"), "vllm, lm_head:"),
    ("sglang", "specforge", set_config(draft_vocab_size=64), "sglang, lm_head: draft_vocab_size=64"),
    ("sglang", "specforge", set_config(tie_word_embeddings=True), "sglang, tied:"),
    ("sglang", "specforge", drop("t2d"), "sglang, tensor names:"),
    ("sglang", "specforge", add("midlayer.extra.weight"), "unknown ['midlayer.extra.weight']"),
    ("vllm", "speculators", set_layer(rope_scaling=None), "vllm, rope: RoPE keys rope_scaling"),
    ("sglang", "specforge", set_config(partial_rotary_factor=None), "sglang, rope: RoPE keys partial_rotary_factor"),
])
def test_each_rule_refuses_a_plan_that_breaks_it(good, engine, fmt, edit, says):
    from eagle3.serve.parity import check_served

    served = plan(good, fmt)
    assert check_served(engine, served)[0] == []
    refusals, _ = check_served(engine, edit(served))
    assert any(says in r for r in refusals), refusals


def test_the_speculators_export_loads_in_speculators_with_its_rope(good, tmp_path, capsys):
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    from eagle3.arch.rope import Rope, read_rope

    assert run(good, tmp_path, capsys)[0] == 0
    layer = Eagle3SpeculatorConfig.from_pretrained(str(tmp_path / "out")).transformer_layer_config
    assert "type" not in layer.rope_parameters  # vLLM's config check rejects the legacy alias there
    assert read_rope({"rope_parameters": layer.rope_parameters}) == Rope(500000.0, LLAMA3)
    assert main([str(tmp_path / "out"), "--out", str(tmp_path / "again")]) == 0  # an export exports again
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == \
        json.loads((tmp_path / "out" / "config.json").read_text())


def test_the_specforge_config_reads_as_a_llama_config_with_its_rope(good, tmp_path, capsys):
    """SpecForge's and SGLang's draft classes are built from the config.json as a transformers LlamaConfig."""
    from transformers import LlamaConfig

    from eagle3.arch.rope import Rope, read_rope

    assert run(good, tmp_path, capsys, "--format", "specforge")[0] == 0
    config = LlamaConfig.from_pretrained(str(tmp_path / "out"))
    assert config.architectures == ["LlamaForCausalLMEagle3"] and config.tie_word_embeddings is False
    assert "type" not in config.rope_parameters
    assert read_rope({"rope_parameters": config.rope_parameters}) == Rope(500000.0, LLAMA3)


def test_a_missing_checkpoint_and_an_empty_verifier_are_refused_in_exports_own_words(good, tmp_path, capsys):
    """export said "init.path: ..." (a run's key, not export's argument) of a missing checkpoint, and exported with
    `--verifier ''` (rc 0)."""
    code, err, _ = run(tmp_path / "missing", tmp_path, capsys)
    assert code == 1 and err.strip() == (
        f"error: checkpoint (eagle3 export's first argument): {tmp_path / 'missing'} does not exist; "
        f"expected a draft checkpoint dir with config.json and model.safetensors (or a sharded index)"), err
    with pytest.raises(SystemExit) as refused:
        main([str(good), "--out", str(tmp_path / "out"), "--verifier", ""])
    err = capsys.readouterr().err
    assert refused.value.code == 2 and "error: --verifier '' names no verifier" in err, err
    assert "Traceback" not in err and not (tmp_path / "out").exists()
