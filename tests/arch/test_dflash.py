"""DFlash (model.draft.kind=dflash, speculators' DFlashDraftModel): its keys checked before any rank starts, built
and planned as speculators builds it, trained through speculators' own forward in DFlash's alignment, its block
proposal in the harness equal to speculators' forward, resumed exactly, exported."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from test_draft_arch import tiny_draft

from commands import reference_and_resumed, run_in_process
from eagle3.config import DraftKind
from eagle3.errors import ConfigError
from eagle3.plan.memory import parameter_counts
from factories import ROOT, SMALL_DATA, compose_cfg, parameter_groups, verifier_model

DFLASH = ["model.draft.kind=dflash"]


def test_plan_counts_the_parameters_of_the_built_dflash_draft():
    from speculators.models.dflash import DFlashDraftModel

    from eagle3.init.build import meta_draft

    draft = tiny_draft(kind=DraftKind.dflash, num_layers=2, ttt_steps=7)
    model = meta_draft(draft, {})
    assert isinstance(model, DFlashDraftModel) and model.block_size == 8 and model.mask_token_id == 1023
    assert len(model.layers) == 2 and model.config.transformer_layer_config.model_type == "qwen3"
    assert parameter_groups(model, draft) == parameter_counts(draft)
    assert not any(p.requires_grad for n, p in model.named_parameters() if n.startswith(("embed_tokens", "lm_head")))


@pytest.mark.parametrize("overrides,message", [
    (["model.draft.block_size=8"], r"model.draft.block_size: is 8, which drafts 7 tokens per verify step, but "
                                   r"model.draft.ttt_steps=3: set model.draft.ttt_steps=7 too"),
    (["model.draft.block_size=1", "model.draft.ttt_steps=0"], r"model.draft.ttt_steps: must be >= 1"),
    (["model.draft.block_size=65", "model.draft.ttt_steps=64"], r"model.draft.ttt_steps: is 64: a DFlash block of "
                                                                r"ttt_steps \+ 1 tokens must hold 2 to 64 tokens"),
    (["model.draft.eagle31=true"], r"model.draft.kind: dflash has none of EAGLE-3's norm flags \(eagle31 set\)"),
    (["model.draft.norm_output=true"], r"dflash has none of EAGLE-3's norm flags \(norm_output set\)"),
    (["model.draft.ttt_step_loss_decay=0.8"], r"model.draft.ttt_step_loss_decay: DFlash weighs"),
    (["model.draft.gradient_checkpointing=true"], r"model.draft.gradient_checkpointing: is not supported"),
    (["model.draft.aux_layer_ids=[1,2,4]"], r"model.draft.aux_layer_ids: \[1, 2, 4\] goes beyond the verifier's 4"),
    (["train.on_policy.enabled=true"], r"train.on_policy.enabled: on-policy rollouts train an EAGLE-3 chain"),
    (["init=pretrained", "init.path=/nonexistent"], r"init.name: init=pretrained reads EAGLE-3 and P-EAGLE"),
], ids=["block-vs-ttt", "ttt-0", "block-65", "eagle31", "flag", "decay", "checkpointing", "aux-ids", "on-policy",
        "pretrained"])
def test_bad_dflash_keys_are_refused_with_one_message_before_any_rank_starts(overrides, message):
    from omegaconf import OmegaConf

    from eagle3.config import validate

    plain = OmegaConf.to_container(compose_cfg([*DFLASH, *overrides]), resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError, match=message):
        validate(plain, dataset_required=False)


def test_block_size_is_dflashs_and_refused_for_other_kinds():
    with pytest.raises(ConfigError, match="model.draft.block_size: is DFlash's block, and model.draft.kind=eagle3"):
        tiny_draft(block_size=4).check()
    tiny_draft(kind=DraftKind.dflash, block_size=8, ttt_steps=7).check()
    tiny_draft(kind=DraftKind.dflash, mask_token_id=7).check()


def small_dflash(k: int = 3, full_vocab: bool = False, **overrides):
    """A DFlash draft with random weights everywhere (bare_draft leaves the verifier's tensors empty)."""
    from eagle3.init.build import bare_draft

    torch.manual_seed(0)
    extra = {"draft_vocab_size": 1024} if full_vocab else {}
    draft_cfg = tiny_draft(kind=DraftKind.dflash, ttt_steps=k, **extra, **overrides)
    draft = bare_draft(draft_cfg, {}, "cpu").eval()
    with torch.no_grad():
        for p in draft.parameters():
            torch.nn.init.normal_(p, std=0.3)
    return draft_cfg, draft



def test_a_dflash_draft_states_a_non_causal_block_for_vllm_which_speculators_reads_for_no_layer_of_it():
    """vLLM's speculators reader makes sliding_window_non_causal every layer's causality (docs/serving.md#dflash);
    speculators reads it for sliding-window layers only, and a draft built here has none."""
    from eagle3.arch.draft import dflash_engine_causal

    _, draft = small_dflash()
    config = draft.config.to_dict()
    assert config["sliding_window_non_causal"] is True and not dflash_engine_causal(config)
    assert not draft.uses_sliding_window_attn and draft.sliding_window_indices == []


def dflash_checkpoint_config(**overrides) -> dict:
    config = {"speculators_model_type": "dflash", "aux_hidden_state_layer_ids": [1, 2, 3], "mask_token_id": 1023,
              "transformer_layer_config": {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}},
              "speculators_config": {"verifier": {"name_or_path": "/v"}}, **overrides}
    return config


def test_export_states_a_non_causal_block_for_a_checkpoint_written_before_eagle3_stated_it(tmp_path):
    from eagle3.serve.export import dflash_config

    old = dflash_checkpoint_config(sliding_window_non_causal=False)
    assert dflash_config(tmp_path, old, None)["sliding_window_non_causal"] is True
    assert old["sliding_window_non_causal"] is False  # the checkpoint's own config is left as it is
    sliding = dflash_checkpoint_config(sliding_window_non_causal=False)
    sliding["transformer_layer_config"]["layer_types"] = ["sliding_attention"]
    assert dflash_config(tmp_path, sliding, None)["sliding_window_non_causal"] is False  # read as speculators does


def test_serve_warns_of_a_dflash_checkpoint_vllm_would_run_causally(tmp_path):
    from eagle3.serve.serving import causal_dflash

    for name, config in {"old": dflash_checkpoint_config(sliding_window_non_causal=False),
                         "new": dflash_checkpoint_config(sliding_window_non_causal=True),
                         "speculators_default_absent": dflash_checkpoint_config(),
                         "eagle3": {"speculators_model_type": "eagle3", "sliding_window_non_causal": False}}.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    warning = causal_dflash(tmp_path / "old")
    assert warning is not None and "sliding_window_non_causal: false" in warning and "causally" in warning
    assert [causal_dflash(tmp_path / n) for n in ("new", "speculators_default_absent", "eagle3")] == [None] * 3

def shifted_and_unshifted(seed: int = 0, docs=(20, 13), n_aux: int = 3, h: int = 128):
    """A packed micro-batch of two documents as the loop gives it (speculators' shift_batch per document) and the
    same documents in DFlash's own alignment, as speculators' trainer feeds its DFlash model."""
    gen = torch.Generator().manual_seed(seed)
    parts: dict[str, list] = {k: [] for k in ("ids", "aux", "last", "mask", "pos", "doc")}
    unshifted: dict[str, list] = {k: [] for k in parts}
    for d, n in enumerate(docs):
        ids, aux, last = torch.randint(0, 1024, (n,), generator=gen), torch.randn(n, n_aux * h, generator=gen), \
            torch.randn(n, h, generator=gen)
        mask = (torch.arange(n) >= 4).long()
        for into, cut in ((parts, slice(1, None)), (unshifted, slice(0, -1))):
            into["ids"].append(ids[cut])
            into["last"].append(last[cut])
            into["mask"].append(mask[cut])
            into["pos"].append(torch.arange(n)[cut])
            into["aux"].append(aux[:-1])  # both: aux state i at place i, the last one dropped
            into["doc"].append(torch.full((n - 1,), d))

    def batch(p):
        return {"input_ids": torch.cat(p["ids"])[None], "hidden_states": torch.cat(p["aux"])[None],
                "verifier_last_hidden_states": torch.cat(p["last"])[None], "loss_mask": torch.cat(p["mask"])[None],
                "position_ids": torch.cat(p["pos"])[None], "document_ids": torch.cat(p["doc"])[None]}

    theirs = batch(unshifted)
    # shift_batch drops each document's first token: DFlash's alignment loses it and the last label (the test's
    # unshifted batch is cut the same way: the place holds no token, so it is masked out).
    for key, first in (("input_ids", 0), ("loss_mask", 0)):
        theirs[key][0, [0, docs[0] - 1]] = first
    theirs["verifier_last_hidden_states"][0, [0, docs[0] - 1]] = 0.0
    return batch(parts), theirs


def test_the_loops_micro_batch_trains_as_speculators_dflash_forward_on_its_own_alignment():
    """The wrapper's forward on the loop's shifted micro-batch gives the loss and counts of speculators' own
    DFlashDraftModel.forward on the documents in DFlash's alignment (same anchors: same seed); its chain counts
    make tau_sim = 1 + sum full_acc_j equal to speculators' eal."""
    from speculators.losses import resolve_loss_config
    from speculators.models.dflash import DFlashDraftModel

    from eagle3.arch.draft import dflash_anchors
    from eagle3.eval.metric_sums import summarize

    _, draft = small_dflash(3)
    ours, theirs = shifted_and_unshifted()
    loss_config = resolve_loss_config("kl_div", "eager")
    draft.train()
    torch.manual_seed(5)
    _, loss, metrics = draft(**ours, loss_config=loss_config)
    torch.manual_seed(5)
    _, their_loss, their_metrics = DFlashDraftModel.forward(
        draft, **theirs, loss_config=loss_config, max_anchors=dflash_anchors(4, ours["input_ids"].shape[1]))
    torch.testing.assert_close(loss, their_loss)
    assert metrics["eal_sum"] == their_metrics["eal_sum"] and metrics["eal_total"] == their_metrics["eal_total"] > 0
    summary = summarize({k: float(v) for k, v in metrics.items()})
    assert summary["tau_sim"] == pytest.approx(summary["eal"])
    assert summary["full_acc_0"] == pytest.approx(summary["position_1_acc"])
    loss.backward()
    assert draft.fc.weight.grad is not None and draft.embed_tokens.weight.grad is None


def test_the_val_pass_samples_the_same_anchors_and_leaves_the_training_rng():
    from speculators.losses import resolve_loss_config

    _, draft = small_dflash(3)
    ours, _ = shifted_and_unshifted()
    kwargs = dict(loss_config=resolve_loss_config("kl_div", "eager"))
    torch.manual_seed(1)
    before = torch.get_rng_state()
    first = draft(**ours, **kwargs)[1]
    assert torch.equal(torch.get_rng_state(), before)
    torch.manual_seed(2)
    assert draft(**ours, **kwargs)[1] == first


def test_the_block_proposal_equals_speculators_dflash_forward_at_that_anchor(monkeypatch):
    """The harness's k tokens of one block after a prefix are what speculators' forward predicts in that anchor's
    block (its select_anchors replaced by the one anchor m); the proposals' count is checked."""
    from eagle3.decoding.drafting import DraftChain, propose_block, verifier_pass

    k = 5
    draft_cfg, draft = small_dflash(k, num_layers=2)
    verifier = verifier_model(None, vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512).eval()
    aux_ids = list(draft_cfg.aux_layer_ids)
    ids = torch.randint(0, 1024, (30,)).tolist()
    m = len(ids) - 1
    states = verifier_pass(verifier, ids, aux_ids)
    drafts, logits = DraftChain(draft).propose(ids, states.aux[:m], k)
    assert len(drafts) == k and drafts == propose_block(draft, ids, states.aux[:m], k)[0]
    with pytest.raises(ConfigError, match="k=6: a DFlash draft of block_size 6 proposes 1 to 5 tokens"):
        propose_block(draft, ids, states.aux[:m], 6)

    block = k + 1
    monkeypatch.setattr("speculators.models.dflash.core.select_anchors",
                        lambda *_: (torch.tensor([m]), torch.tensor([True])))
    n = m + block  # room for the block after the anchor
    pad = n - len(ids)
    with torch.no_grad():
        _, theirs, _, _, _ = draft._backbone_forward(
            torch.cat([states.aux, torch.zeros(pad, states.aux.shape[1])])[None],
            torch.tensor([ids + [0] * pad]), torch.ones(1, n, dtype=torch.long), torch.zeros(1, n, 128),
            torch.zeros(1, n, dtype=torch.long), max_anchors=1)
    for j in range(k):
        torch.testing.assert_close(logits[j], theirs[0, j + 1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape,arch", [(("T512 k3 eager", 512, 3, "eager", False), {}),
                                        (("T768 k7 sdpa", 768, 7, "sdpa", False), {"num_layers": 2})],
                         ids=["T512-k3-eager", "T768-k7-sdpa-2layers"])
def test_planned_peak_of_a_dflash_draft_is_within_25_percent_of_the_measured_one(shape, arch):
    """The plan runs DFlash's one pass of anchor blocks over the context and the blocks."""
    sys.path.insert(0, str(ROOT / "bench"))
    from plan_memory import compare

    result = compare(*shape, kind=DraftKind.dflash, **arch)
    assert 0.75 <= result["ratio"] <= 1.25, result


@pytest.mark.slow
def test_dflash_trains_resumes_exactly_after_sigterm_exports_and_is_measured(cache_dir, tmp_path):
    from speculators.models.dflash import DFlashDraftModel

    args = ["optim.max_steps=8", "logger.log_every=1", "logger.mode=disabled", *SMALL_DATA, *DFLASH]
    reference, stopped = reference_and_resumed(args, cache_dir, tmp_path)
    ref, res = (json.loads((d / "summary.json").read_text()) for d in (reference, stopped))
    assert res["steps"] == ref["steps"] == 8
    # Anchors are drawn from the training RNG: exact only if the checkpoint carried it.
    assert res["final"]["loss"] == pytest.approx(ref["final"]["loss"], rel=1e-6)
    assert res["final"]["tau_sim"] == pytest.approx(ref["final"]["tau_sim"], rel=1e-6)
    assert res["final"]["tau_sim"] == pytest.approx(res["final"]["eal"])
    assert ref["final"]["loss"] < ref["step0"]["loss"]

    out_dir = tmp_path / "export"
    exported = run_in_process(["python", "-m", "eagle3.serve.export", str(stopped / "checkpoints" / "last"), "--out",
                               str(out_dir)])
    assert exported.returncode == 0, exported.stderr[-3000:]
    config = json.loads((out_dir / "config.json").read_text())
    assert config["speculators_model_type"] == "dflash" and config["block_size"] == 4
    assert config["sliding_window_non_causal"] is True  # trained so: vLLM runs the block non-causally
    model = DFlashDraftModel.from_pretrained(str(out_dir))
    assert type(model) is DFlashDraftModel and model.mask_token_id == 1023 and model.t2d is not None

    measured = run_in_process(["python", "-m", "eagle3.eval.accept", "--run", str(stopped), "--num-prompts", "2",
                               "--max-new-tokens", "16"], cache_dir)
    assert measured.returncode == 0, measured.stderr[-3000:]
    report = json.loads((stopped / "accept_k3.json").read_text())
    assert report["k"] == 3 and 1.0 <= report["accept_len"] <= 4.0
