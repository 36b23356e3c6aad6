"""Draft architectures as a choice (eagle3/arch/draft.py): model.draft.num_layers, model.draft.layer_type and
model.draft.eagle31 reach the built model, the plan, the harness, training with resume, and the export."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from omegaconf import OmegaConf

from commands import reference_and_resumed, run_in_process
from eagle3.arch.draft import resolved_flags
from eagle3.config import EAGLE31_FLAGS, SPECULATORS_FLAGS, DraftConfig, LayerType
from eagle3.errors import ConfigError
from eagle3.plan.memory import parameter_counts
from factories import (
    QWEN3_EAGLE31,
    QWEN3_EAGLE31_RUN,
    ROOT,
    SMALL_DATA,
    assert_chain_equals_speculators_forward,
    compose_cfg,
    parameter_groups,
    verifier_model,
)

ARCHS = [(LayerType.llama, 1), (LayerType.llama, 2), (LayerType.qwen3, 1), (LayerType.qwen3, 3)]


def tiny_draft(**overrides) -> DraftConfig:
    plain = OmegaConf.to_container(compose_cfg().model.draft, resolve=True)
    return DraftConfig(**{**plain, **overrides})


@pytest.mark.parametrize("eagle31", [False, True], ids=["eagle3", "eagle31"])
@pytest.mark.parametrize("layer_type,num_layers", ARCHS, ids=lambda a: str(getattr(a, "value", a)))
def test_plan_counts_the_parameters_of_the_built_draft(layer_type, num_layers, eagle31):
    from eagle3.init.build import meta_draft

    draft = tiny_draft(layer_type=layer_type, num_layers=num_layers, eagle31=eagle31, num_key_value_heads=2)
    model = meta_draft(draft, resolved_flags(draft, SPECULATORS_FLAGS))
    assert len(model.layers) == num_layers
    assert model.config.transformer_layer_config.model_type == layer_type.value
    assert parameter_groups(model, draft) == parameter_counts(draft)


def test_a_layer_type_typo_fails_at_composition():
    with pytest.raises(Exception, match="qwen4"):
        compose_cfg(["model.draft.layer_type=qwen4"])
    assert compose_cfg(["model.draft.layer_type=qwen3"]).model.draft.layer_type == LayerType.qwen3


def test_eagle31_sets_its_flags_and_refuses_contradictions():
    from eagle3.init.build import bare_draft

    draft = tiny_draft(eagle31=True)
    draft.check()
    assert resolved_flags(draft, SPECULATORS_FLAGS) == EAGLE31_FLAGS
    model = bare_draft(draft, resolved_flags(draft, SPECULATORS_FLAGS), "meta")
    assert model.fc_norm is not None and len(model.fc_norm) == 3 and model.input_norm is None
    assert model.config.norm_output and model.config.fc_norm and not model.config.norm_before_fc
    for bad in ({"fc_norm": False}, {"norm_before_fc": True}, {"norm_output": False}):
        with pytest.raises(ConfigError, match="eagle31"):
            tiny_draft(eagle31=True, **bad).check()
    with pytest.raises(ConfigError, match="not both"):
        tiny_draft(norm_before_fc=True, fc_norm=True).check()
    with pytest.raises(ConfigError, match="num_layers"):
        tiny_draft(num_layers=0).check()


@pytest.mark.parametrize("layer_type", [LayerType.llama, LayerType.qwen3])
def test_the_harness_chain_equals_speculators_forward_with_two_layers(layer_type):
    """Each step of the harness's chain with a 2-layer draft equals speculators' TTT step on the sequence whose
    teacher-forced tokens are the draft's own proposals (as tests/eval/test_accept.py checks the 1-layer draft)."""
    from eagle3.decoding.drafting import DraftChain, verifier_pass
    from eagle3.init.build import bare_draft

    torch.manual_seed(0)
    draft_cfg = tiny_draft(layer_type=layer_type, num_layers=2)
    verifier = verifier_model(None, vocab_size=draft_cfg.vocab_size, hidden_size=draft_cfg.hidden_size,
                              intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                              max_position_embeddings=512).eval()
    draft = bare_draft(draft_cfg, SPECULATORS_FLAGS, "cpu").eval()
    with torch.no_grad():
        for p in (draft.embed_tokens.weight, draft.lm_head.weight):
            torch.nn.init.normal_(p, std=0.5)
    aux_ids, k = list(draft_cfg.aux_layer_ids), 4
    ids = torch.randint(0, draft_cfg.vocab_size, (40,)).tolist()
    drafts = assert_chain_equals_speculators_forward(draft, verifier, ids, aux_ids, k)
    aux = verifier_pass(verifier, ids, aux_ids).aux[:len(ids) - 1]
    assert DraftChain(draft).propose(ids, aux, k)[0] == drafts  # the cached chain decides the same


ARCH_RUNS = {
    "llama-2": ["model.draft.num_layers=2"],
    "qwen3-1": ["model.draft.layer_type=qwen3"],
    "qwen3-2-eagle31-ckpt": QWEN3_EAGLE31,  # its reference run trained once (conftest), served too
}


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCH_RUNS))
def test_each_architecture_trains_resumes_exactly_after_sigterm_and_exports(arch, cache_dir, tmp_path, request):
    from speculators.models.eagle3 import Eagle3DraftModel

    args = ["optim.max_steps=8", "logger.log_every=1", "logger.mode=disabled", *SMALL_DATA, *ARCH_RUNS[arch]]
    shared = args == QWEN3_EAGLE31_RUN
    reference, stopped = reference_and_resumed(args, cache_dir, tmp_path, request.getfixturevalue(
        "qwen3_eagle31_run") if shared else None)
    ref, res = (json.loads((d / "summary.json").read_text()) for d in (reference, stopped))
    assert res["steps"] == ref["steps"] == 8
    assert res["final"]["loss"] == pytest.approx(ref["final"]["loss"], rel=1e-4)

    out_dir = tmp_path / "export"
    exported = run_in_process(["python", "-m", "eagle3.serve.export", str(stopped / "checkpoints" / "last"), "--out",
                               str(out_dir)])
    assert exported.returncode == 0, exported.stderr[-3000:]
    model = Eagle3DraftModel.from_pretrained(str(out_dir))
    layer_config = model.config.transformer_layer_config
    overrides = dict(o.split("=", 1) for o in ARCH_RUNS[arch])
    assert len(model.layers) == layer_config.num_hidden_layers == int(overrides.get("model.draft.num_layers", 1))
    assert layer_config.model_type == overrides.get("model.draft.layer_type", "llama")
    assert bool(model.config.fc_norm) == (overrides.get("model.draft.eagle31") == "true")


@pytest.mark.parametrize("layer_type,num_layers,refusal", [(LayerType.llama, 2, "num_hidden_layers=2"),
                                                          (LayerType.qwen3, 1, "model_type='qwen3'")])
def test_the_sglang_export_refuses_a_draft_sglang_would_build_otherwise(layer_type, num_layers, refusal, tmp_path):
    """SGLang builds one Llama midlayer: a deeper or Qwen3-type draft is refused with the reason, while the
    speculators export (vLLM builds llama and qwen3 layers, any number) writes it."""
    from eagle3.init.build import bare_draft
    from eagle3.init.files import CheckpointError
    from eagle3.init.pretrained import SPECFORGE_FLAGS
    from eagle3.serve.export import export

    draft = tiny_draft(layer_type=layer_type, num_layers=num_layers)
    checkpoint = tmp_path / "ckpt"
    bare_draft(draft, SPECFORGE_FLAGS, "cpu").save_pretrained(str(checkpoint))
    with pytest.raises(CheckpointError, match=refusal):
        export(checkpoint, tmp_path / "sglang", fmt="specforge", verifier="org/verifier")
    assert not (tmp_path / "sglang").exists()
    export(checkpoint, tmp_path / "vllm", fmt="speculators", verifier="org/verifier")
    written = json.loads((tmp_path / "vllm" / "config.json").read_text())["transformer_layer_config"]
    assert (written["model_type"], written["num_hidden_layers"]) == (layer_type.value, num_layers)


@pytest.mark.slow  # measures the peak memory of real training steps: 5-12 s each on 2 cores
@pytest.mark.parametrize("layer_type", [LayerType.llama, LayerType.qwen3])
@pytest.mark.parametrize("shape", [("T768 k4 sdpa", 768, 4, "sdpa", False),
                                   ("T512 k3 sdpa ckpt", 512, 3, "sdpa", True)],
                         ids=lambda s: getattr(s, "value", s[0] if isinstance(s, tuple) else s))
def test_planned_peak_of_a_two_layer_draft_is_within_25_percent_of_the_measured_one(shape, layer_type):
    sys.path.insert(0, str(ROOT / "bench"))
    from plan_memory import compare

    result = compare(*shape, num_layers=2, layer_type=layer_type)
    assert 0.75 <= result["ratio"] <= 1.25, result


def test_a_pretrained_draft_of_another_architecture_is_refused_by_name(tmp_path):
    """init=pretrained compares the checkpoint's decoder type and depth with the run's, as it does its flags."""
    from eagle3.init import InitContext
    from eagle3.init.build import bare_draft
    from eagle3.init.files import CheckpointError
    from eagle3.init.pretrained import read_source, resolve_architecture

    trained = tiny_draft(layer_type=LayerType.qwen3, num_layers=2)
    checkpoint = tmp_path / "ckpt"
    bare_draft(trained, SPECULATORS_FLAGS, "cpu").save_pretrained(str(checkpoint))
    source = read_source(checkpoint, {})

    def context(draft):
        return InitContext(draft, None, tmp_path, tmp_path, "sdpa", [])  # type: ignore[arg-type]

    with pytest.raises(CheckpointError) as refused:
        resolve_architecture(context(tiny_draft()), source)
    assert "model.draft.layer_type: the run says qwen3" not in str(refused.value)
    assert "model.draft.layer_type: the run says llama, the checkpoint qwen3" in str(refused.value)
    assert "model.draft.num_layers: the run says 1, the checkpoint 2" in str(refused.value)
    flags, _ = resolve_architecture(context(trained), source)
    assert flags == SPECULATORS_FLAGS
