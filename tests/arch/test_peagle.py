"""P-EAGLE (model.draft.kind=peagle, speculators' PEagleDraftModel): built and planned as speculators builds it,
trained through the loop, its one-forward proposal in the harness, resumed exactly, exported, and served."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from test_draft_arch import tiny_draft

from commands import reference_and_resumed, run_in_process
from eagle3.arch.draft import resolved_flags
from eagle3.config import SPECULATORS_FLAGS, DraftKind, LayerType
from eagle3.errors import ConfigError
from eagle3.plan.memory import parameter_counts
from factories import ROOT, SMALL_DATA, compose_cfg, parameter_groups, verifier_model


@pytest.mark.parametrize("layer_type,num_layers", [(LayerType.llama, 1), (LayerType.qwen3, 2)],
                         ids=["llama-1", "qwen3-2"])
def test_plan_counts_the_parameters_of_the_built_peagle_draft(layer_type, num_layers):
    from speculators.models.peagle import PEagleDraftModel

    from eagle3.init.build import meta_draft

    draft = tiny_draft(kind=DraftKind.peagle, layer_type=layer_type, num_layers=num_layers)
    model = meta_draft(draft, resolved_flags(draft, SPECULATORS_FLAGS))
    assert isinstance(model, PEagleDraftModel) and model.mask_token_id == draft.vocab_size - 1
    assert len(model.layers) == num_layers
    counts = parameter_counts(draft)
    assert parameter_groups(model, tiny_draft(kind=DraftKind.peagle)) == counts
    # What P-EAGLE adds to an EAGLE-3 draft of the same shape: the mask's aux states and a trained embedding.
    eagle3 = parameter_counts(tiny_draft(layer_type=layer_type, num_layers=num_layers))
    assert sum(n for n, _ in counts.values()) - sum(n for n, _ in eagle3.values()) == 3 * draft.hidden_size
    assert counts["embed_tokens (verifier's, trained)"] == (draft.vocab_size * draft.hidden_size, True)


def test_the_draft_kind_and_mask_token_are_checked_where_declared():
    with pytest.raises(Exception, match="pegle"):
        compose_cfg(["model.draft.kind=pegle"])
    assert compose_cfg(["model.draft.kind=peagle"]).model.draft.kind == DraftKind.peagle
    with pytest.raises(ConfigError, match=r"model.draft.mask_token_id: must be a token id in \[0, "):
        tiny_draft(kind=DraftKind.peagle, mask_token_id=1024).check()
    with pytest.raises(ConfigError, match="model.draft.ttt_step_loss_decay"):
        tiny_draft(kind=DraftKind.peagle, ttt_step_loss_decay=0.8).check()
    tiny_draft(kind=DraftKind.peagle, mask_token_id=5).check()


def small_peagle(k: int = 3, **overrides):
    """A P-EAGLE draft with random weights everywhere (bare_draft leaves the verifier's tensors empty)."""
    from eagle3.init.build import bare_draft

    torch.manual_seed(0)
    draft_cfg = tiny_draft(kind=DraftKind.peagle, ttt_steps=k, **overrides)
    draft = bare_draft(draft_cfg, resolved_flags(draft_cfg, SPECULATORS_FLAGS), "cpu").eval()
    with torch.no_grad():
        for p in draft.parameters():
            torch.nn.init.normal_(p, std=0.3)
    return draft_cfg, draft


@pytest.mark.parametrize("layer_type", [LayerType.llama, LayerType.qwen3])
def test_the_one_forward_proposal_equals_speculators_peagle_forward(layer_type, monkeypatch):
    """The harness's k tokens of one P-EAGLE forward after a prefix are what speculators' training forward
    predicts at that anchor's depths 0..k-1 (the mask token and mask_hidden in the masked slots); the cached
    chain decides the same as the uncached one."""
    from speculators.losses import resolve_loss_config

    from eagle3.decoding.drafting import DraftChain, propose, verifier_pass

    k = 4
    draft_cfg, draft = small_peagle(k, layer_type=layer_type, num_layers=2)
    verifier = verifier_model(None, vocab_size=draft_cfg.vocab_size, hidden_size=draft_cfg.hidden_size,
                              intermediate_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                              max_position_embeddings=512).eval()
    aux_ids = list(draft_cfg.aux_layer_ids)
    ids = torch.randint(0, draft_cfg.vocab_size, (30,)).tolist()
    m = len(ids) - 1
    aux = verifier_pass(verifier, ids, aux_ids).aux[:m]
    drafts, logits = propose(draft, ids, aux, k)
    assert len(drafts) == k
    chain = DraftChain(draft)
    assert chain.propose(ids[:-3], aux[:-3], k)[0] == propose(draft, ids[:-3], aux[:-3], k)[0]
    assert chain.propose(ids, aux, k)[0] == drafts  # the cache from the shorter prefix, extended

    # speculators' forward on the same sequence, its COD sampling replaced by: every index at depth 0, plus the
    # last index (the anchor m-1) at depths 1..k-1.
    anchor = torch.cat([torch.arange(m), torch.full((k - 1,), m - 1)])
    depth = torch.cat([torch.zeros(m, dtype=torch.long), torch.arange(1, k)])
    monkeypatch.setattr("speculators.models.peagle.core.generate_cod_sample_indices",
                        lambda **_: (anchor, depth))
    captured = []
    hook = draft.lm_head.register_forward_hook(lambda _m, _i, out: captured.append(out[0]))
    with torch.no_grad():
        # Depths beyond the sequence read positions past it: pad it with k - 1 slots that nothing else sees.
        hidden = torch.cat([aux, torch.zeros(k - 1, aux.shape[1])])[None]
        tokens = torch.tensor([ids[1:] + [0] * (k - 1)])
        draft(hidden_states=hidden, input_ids=tokens, document_ids=torch.zeros_like(tokens),
              loss_mask=torch.ones_like(tokens, dtype=torch.float32),
              verifier_last_hidden_states=torch.zeros(1, tokens.shape[1], draft_cfg.hidden_size), ttt_steps=k,
              loss_config=resolve_loss_config("kl_div", "eager"))
    hook.remove()
    theirs = captured[0][m - 1:]
    for j in range(k):
        torch.testing.assert_close(logits[j], theirs[j], rtol=1e-4, atol=1e-4)


def test_the_sglang_export_refuses_a_peagle_draft(tmp_path):
    """SGLang's EAGLE-3 drafter has no parallel drafting: the SpecForge layout is refused with the reason and
    nothing written, while the speculators export (vLLM's P-EAGLE) writes it with its mask and embedding."""
    from eagle3.init.files import CheckpointError
    from eagle3.serve.export import export

    _, draft = small_peagle()
    checkpoint = tmp_path / "ckpt"
    draft.save_pretrained(str(checkpoint))
    with pytest.raises(CheckpointError, match="P-EAGLE draft: the specforge layout .* has no parallel drafting"):
        export(checkpoint, tmp_path / "sglang", fmt="specforge", verifier="org/verifier")
    assert not (tmp_path / "sglang").exists()
    export(checkpoint, tmp_path / "vllm", fmt="speculators", verifier="org/verifier")
    written = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert written["speculators_model_type"] == "peagle" and written["mask_token_id"] == 1023


def test_vllm_refuses_a_peagle_draft_with_per_aux_norms(tmp_path):
    """vLLM's P-EAGLE config reader drops fc_norm: an EAGLE-3.1-style P-EAGLE would be served without its norms."""
    from eagle3.init.files import CheckpointError
    from eagle3.serve.export import export

    _, draft = small_peagle(eagle31=True)
    checkpoint = tmp_path / "ckpt"
    draft.save_pretrained(str(checkpoint))
    with pytest.raises(CheckpointError, match="parallel drafting: fc_norm=true: vLLM's P-EAGLE config reader drops"):
        export(checkpoint, tmp_path / "vllm", fmt="speculators", verifier="org/verifier")


@pytest.mark.parametrize("flag", ["model.draft.eagle31=true", "model.draft.fc_norm=true"])
@pytest.mark.parametrize("serve", [[], ["eval.serve.enabled=true"]], ids=["trained", "served at the end"])
def test_a_peagle_draft_with_eagle31_norms_is_refused_before_training_by_exports_rule(flag, serve):
    """It trained without a word and only export refused it (vLLM's P-EAGLE reader drops fc_norm); the run's config
    check applies export's rule (eagle3.config.kind_flag_problem), before any rank starts."""
    from omegaconf import OmegaConf

    from eagle3.config import kind_flag_problem, validate

    rule = kind_flag_problem(DraftKind.peagle, {"fc_norm": True})
    plain = OmegaConf.to_container(compose_cfg(["model.draft.kind=peagle", flag, "model.draft.norm_before_fc=false",
                                                *serve]), resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError) as refused:
        validate(plain, dataset_required=False)
    assert str(refused.value).startswith("model.draft.kind: peagle with EAGLE-3.1's norms (eagle31=true or "
                                         "fc_norm=true) trains a draft no engine serves as trained (")
    assert rule is not None and f"({rule}; export refuses it)" in str(refused.value)
    plain = OmegaConf.to_container(compose_cfg([flag, "model.draft.norm_before_fc=false", *serve]), resolve=True,
                                   enum_to_str=True)
    validate(plain, dataset_required=False)  # EAGLE-3.1 as an EAGLE-3 draft: vLLM serves it


PEAGLE = ["model.draft.kind=peagle"]


@pytest.mark.slow
def test_peagle_trains_resumes_exactly_after_sigterm_and_exports(cache_dir, tmp_path):
    from speculators.models.peagle import PEagleDraftModel

    args = ["optim.max_steps=8", "logger.log_every=1", "logger.mode=disabled", *SMALL_DATA, *PEAGLE]
    reference, stopped = reference_and_resumed(args, cache_dir, tmp_path)
    ref, res = (json.loads((d / "summary.json").read_text()) for d in (reference, stopped))
    assert res["steps"] == ref["steps"] == 8
    # COD sampling draws its positions from the training RNG: exact only if the checkpoint carried it.
    assert res["final"]["loss"] == pytest.approx(ref["final"]["loss"], rel=1e-6)
    assert res["final"]["tau_sim"] == pytest.approx(ref["final"]["tau_sim"], rel=1e-6)
    assert ref["final"]["loss"] < ref["step0"]["loss"]

    out_dir = tmp_path / "export"
    exported = run_in_process(["python", "-m", "eagle3.serve.export", str(stopped / "checkpoints" / "last"), "--out",
                               str(out_dir)])
    assert exported.returncode == 0, exported.stderr[-3000:]
    model = PEagleDraftModel.from_pretrained(str(out_dir))
    assert type(model) is PEagleDraftModel and model.mask_token_id == 1023 and model.embed_tokens.weight.requires_grad
    assert model.config.speculators_config.proposal_methods[0].speculative_tokens == 3


@pytest.mark.parametrize("shape,arch", [(("T512 k3 sdpa", 512, 3, "sdpa", False), {}),
                                        (("T1024 k2 eager", 1024, 2, "eager", False), {}),
                                        (("T768 k4 sdpa", 768, 4, "sdpa", False), {"num_layers": 2})],
                         ids=["T512-k3-sdpa", "T1024-k2-eager", "T768-k4-sdpa-2layers"])
def test_planned_peak_of_a_peagle_draft_is_within_25_percent_of_the_measured_one(shape, arch):
    """The plan runs P-EAGLE's one pass over its COD-sampled positions, not k TTT steps over all of them."""
    sys.path.insert(0, str(ROOT / "bench"))
    from plan_memory import compare

    result = compare(*shape, kind=DraftKind.peagle, **arch)
    assert 0.75 <= result["ratio"] <= 1.25, result
