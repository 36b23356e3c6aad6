"""On-policy rollouts of the draft (eagle3/decoding/rollout.py): the rows a verify round gives, their targets, the
draft's unrolled steps and the loss, on a tiny verifier and a tiny draft built here."""

from __future__ import annotations

import pytest
import torch

from eagle3.decoding.drafting import Sampling, propose
from eagle3.decoding.rollout import Rollout, rollout, rollout_loss, unrolled_logits

VOCAB, DRAFT_VOCAB, HIDDEN, K, AUX = 64, 40, 32, 3, [0, 1, 2]
PROMPTS = [[3, 7, 1, 12, 5], [9, 2, 33, 4, 4, 17, 8]]


@pytest.fixture(scope="module")
def verifier_dir(tmp_path_factory):
    from eagle3.config import TinyVerifierConfig
    from eagle3.verifier.tiny import tiny_verifier_dir

    tiny = TinyVerifierConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=64, num_layers=3, num_heads=2,
                              max_position_embeddings=128, init_std=0.02, logit_scale=15.0, seed=0, perturb_std=0.0,
                              token_shift=0.0, perturb_seed=1)
    return tiny_verifier_dir(tiny, str(tmp_path_factory.mktemp("on-policy")))


@pytest.fixture(scope="module")
def verifier(verifier_dir):
    from eagle3.verifier.model import Verifier

    return Verifier(verifier_dir).load()


def make_draft(verifier_dir, attn_impl="sdpa", num_layers=1, seed=0):
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    from eagle3.config import SPECULATORS_FLAGS, DraftConfig
    from eagle3.init.build import new_draft

    d2t, t2d = build_vocab_mappings_from_distribution({i: (7 * i) % VOCAB + 1 for i in range(VOCAB)},
                                                       draft_vocab_size=DRAFT_VOCAB, target_vocab_size=VOCAB)
    cfg = DraftConfig(hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                      head_dim=16, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6,
                      hidden_act="silu", vocab_size=VOCAB, aux_layer_ids=AUX, draft_vocab_size=DRAFT_VOCAB,
                      ttt_steps=K, num_layers=num_layers)
    torch.manual_seed(seed)
    draft = new_draft(cfg, SPECULATORS_FLAGS, attn_impl, str(verifier_dir), t2d, d2t).float()
    with torch.no_grad():  # a draft with opinions: some of its proposals are accepted, some not
        for p in draft.layers.parameters():
            p.mul_(3.0)
    return draft


def rows(verifier, draft, temperature=0.0, max_new_tokens=14) -> list[Rollout]:
    sampling = Sampling(temperature, seed=5)
    return [rollout(verifier, draft, p, K, max_new_tokens, AUX, sampling) for p in PROMPTS]


def accept_len(data: list[Rollout]) -> float:
    lens = [n + 1 for row in data for n in row.accepted]
    return sum(lens) / len(lens)


@pytest.fixture(scope="module")
def trained(verifier, verifier_dir):
    """A draft trained on its own rollouts for a few steps (AdamW on rollout_loss alone): (before, after)."""
    from speculators.losses import resolve_loss_config

    draft = make_draft(verifier_dir)
    before = accept_len(rows(verifier, draft))
    optimizer = torch.optim.AdamW([p for p in draft.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(8):
        loss, _ = rollout_loss(draft, rows(verifier, draft), resolve_loss_config("kl_div", "eager"), 1.0)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return draft, before, accept_len(rows(verifier, draft))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_soft_targets_are_the_verifiers_plain_distributions_over_the_drafted_sequences(verifier, verifier_dir,
                                                                                       temperature):
    draft = make_draft(verifier_dir)
    keep = draft.t2d.nonzero().flatten()
    checked = 0
    for row in rows(verifier, draft, temperature):
        assert len(row.ends) == len(row.drafts) == len(row.targets) == len(row.accepted) > 1
        assert row.aux.shape[0] == len(row.ids) - 1
        for end, drafts, target in zip(row.ends, row.drafts, row.targets):
            m = end + 1
            with torch.no_grad():  # a plain forward, no cache, over the prefix and this round's drafts
                logits = verifier(input_ids=torch.tensor([row.ids[:m + 1] + drafts])).logits[0, m:m + K].float()
            expected = torch.softmax(logits[:, keep], -1)
            torch.testing.assert_close(torch.softmax(target, -1), expected, atol=1e-5, rtol=0)
            checked += 1
    assert checked > 4


@pytest.mark.parametrize("attn_impl,num_layers", [("sdpa", 1), ("eager", 1), ("sdpa", 2), ("trained", 1)])
def test_unrolled_steps_are_what_propose_computes(verifier, verifier_dir, trained, attn_impl, num_layers):
    draft = trained[0] if attn_impl == "trained" else make_draft(verifier_dir, attn_impl, num_layers)
    saw = {"accepted": 0, "rejected": 0}
    for row in rows(verifier, draft):
        unrolled = unrolled_logits(draft, row)
        assert unrolled.shape == (len(row.ends), K, DRAFT_VOCAB)
        for r, end in enumerate(row.ends):
            m = end + 1
            proposals, step_logits = propose(draft, row.ids[:m + 1], row.aux[:m], K)
            assert proposals == row.drafts[r]  # greedy: the chain the rollout drafted
            torch.testing.assert_close(unrolled[r].detach(), torch.stack(step_logits), atol=1e-5, rtol=0)
            saw["accepted" if row.accepted[r] else "rejected"] += 1
    assert saw["rejected"] and (saw["accepted"] or attn_impl != "trained"), saw


def test_training_on_rollouts_raises_their_acceptance(trained):
    _, before, after = trained
    assert before < 1.05 and after > before + 0.2, (before, after)


def test_loss_is_finite_reaches_every_step_and_vanishes_at_the_targets(verifier, verifier_dir):
    from speculators.losses import resolve_loss_config

    draft = make_draft(verifier_dir)
    loss_config = resolve_loss_config("kl_div", "eager")
    data = rows(verifier, draft, temperature=1.0)
    loss, metrics = rollout_loss(draft, data, loss_config, 1.0)
    assert torch.isfinite(loss) and loss > 0.1
    loss.backward()
    for name in ("fc.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight"):
        grad = dict(draft.named_parameters())[name].grad
        assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0, name
    rounds = sum(len(r.ends) for r in data)
    assert float(metrics["rollout_accept_len_total"]) == rounds
    assert float(metrics["rollout_accept_len_sum"]) == sum(n + 1 for r in data for n in r.accepted)

    # The draft's own distributions as the targets: the forward KL is zero at every step of every round.
    for row in data:
        with torch.no_grad():
            row.targets = list(unrolled_logits(draft, row))
    zero, _ = rollout_loss(draft, data, loss_config, 1.0)
    assert float(zero) < 1e-5
    # ... and a target one step off (step j's row given to step j+1) is not.
    for row in data:
        row.targets = [t.roll(1, dims=0) for t in row.targets]
    assert float(rollout_loss(draft, data, loss_config, 1.0)[0]) > 0.01


@pytest.mark.parametrize("override,message", [
    ("train.on_policy.mix=0", "train.on_policy.mix: is the rollouts' share of the loss, in (0, 1]"),
    ("train.on_policy.mix=1.5", "train.on_policy.mix"),
    ("train.on_policy.every=0", "train.on_policy.every: must be >= 1"),
    ("train.on_policy.temperature=-1", "train.on_policy.temperature: must be >= 0"),
    ("train.on_policy.max_new_tokens=1", "train.on_policy.max_new_tokens: must be >= 2"),
])
def test_on_policy_options_are_checked(override, message):
    from omegaconf import OmegaConf

    from eagle3.config import ConfigError, validate
    from factories import compose_cfg

    plain = OmegaConf.to_container(compose_cfg([override]), resolve=True)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")):
        validate(plain, dataset_required=False)


def test_on_policy_is_off_by_default_and_refuses_fsdp_and_flex_attention(verifier_dir):
    from omegaconf import OmegaConf

    from eagle3.config import ConfigError, validate
    from eagle3.decoding.rollout import check_attention
    from factories import compose_cfg

    plain = OmegaConf.to_container(compose_cfg(), resolve=True)
    assert validate(plain, dataset_required=False).train.on_policy.enabled is False
    fsdp = OmegaConf.to_container(compose_cfg(["train.on_policy.enabled=true", "distributed=fsdp",
                                               "distributed.nproc_per_node=2"]), resolve=True)
    with pytest.raises(ConfigError, match="train.on_policy.enabled: .*FSDP"):
        validate(fsdp, dataset_required=False)
    sharded = OmegaConf.to_container(compose_cfg(["train.on_policy.enabled=true", "data=online",
                                                  "data.shard_verifier=true"]), resolve=True)
    with pytest.raises(ConfigError, match="train.on_policy.enabled: .*shard_verifier"):
        validate(sharded, dataset_required=False)
    with pytest.raises(ConfigError, match="model.draft.attn_impl=sdpa"):
        check_attention(make_draft(verifier_dir, "simple_flex_attention"))


@pytest.mark.slow
def test_on_policy_run_stopped_and_resumed_equals_the_uninterrupted_run(cache_dir, tmp_path):
    import json

    from commands import reference_and_resumed
    from factories import SMALL_DATA, read_rows

    args = ["optim.max_steps=6", "logger.log_every=1", "logger.mode=disabled", *SMALL_DATA,
            "train.on_policy.enabled=true", "train.on_policy.start_step=1", "train.on_policy.every=2",
            "train.on_policy.temperature=1.0", "train.on_policy.num_prompts=2", "train.on_policy.max_new_tokens=12"]
    reference, stopped = reference_and_resumed(args, cache_dir, tmp_path)

    def train_rows(run_dir):
        return {r["step"]: r for r in read_rows(run_dir) if r["split"] == "train"}

    ref, res = train_rows(reference), train_rows(stopped)
    assert sorted(ref) == sorted(res) == [1, 2, 3, 4, 5, 6]
    # Rollouts ran at the steps after 1, 3 and 5 done ones: the train rows of steps 2, 4 and 6 carry them.
    assert [s for s in ref if "rollout_accept_len" in ref[s]] == [2, 4, 6]
    for step, row in ref.items():
        for key in ("loss", "rollout_loss", "rollout_accept_len"):
            if key in row:
                assert res[step][key] == pytest.approx(row[key], rel=1e-5), (step, key)
    summaries = [json.loads((d / "summary.json").read_text()) for d in (reference, stopped)]
    assert summaries[1]["final"]["loss"] == pytest.approx(summaries[0]["final"]["loss"], rel=1e-5)


@pytest.mark.slow
def test_eval_accept_measures_with_the_rollouts_verifier_instead_of_loading_a_second(cache_dir, tmp_path):
    from unittest import mock

    import eagle3.train.on_policy as rollouts
    import eagle3.train.val_acceptance as at_val
    from commands import launch
    from factories import SMALL_DATA, read_rows

    held: dict[str, object] = {}

    def built(*args, **kwargs):
        held["rollouts"] = (on_policy := build(*args, **kwargs)).verifier
        return on_policy

    class Measured(at_val.AcceptanceAtVal):
        def __init__(self, *args, verifier=None, **kwargs):
            held["eval.accept"] = verifier
            super().__init__(*args, verifier=verifier, **kwargs)

    build = rollouts.build_on_policy
    with mock.patch.object(rollouts, "build_on_policy", built), mock.patch.object(at_val, "AcceptanceAtVal", Measured):
        proc = launch([f"hydra.run.dir={tmp_path / 'run'}", "optim.max_steps=2", "logger.mode=disabled", *SMALL_DATA,
                       "train.on_policy.enabled=true", "train.on_policy.num_prompts=1",
                       "train.on_policy.max_new_tokens=8", "eval.accept.enabled=true", "eval.accept.num_prompts=2",
                       "eval.accept.max_new_tokens=8"], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert held["eval.accept"] is not None and held["eval.accept"] is held["rollouts"]
    assert [r for r in read_rows(tmp_path / "run") if r["split"] == "val" and "accept_len" in r]


def test_a_rollout_step_mixes_the_rollout_loss_and_the_micro_batches_at_mix(verifier, verifier_dir):
    from contextlib import nullcontext

    from speculators.losses import resolve_loss_config

    from eagle3.decoding.drafting import verifier_pass
    from eagle3.train.loop import StepParts, train_step

    draft = make_draft(verifier_dir)
    loss_config = resolve_loss_config("kl_div", "eager")
    ids = PROMPTS[1] * 3
    states = verifier_pass(verifier, ids, AUX)
    length = len(ids) - 1
    batch = {"hidden_states": states.aux[None, :length], "verifier_last_hidden_states": states.last[None, 1:],
             "input_ids": torch.tensor([ids[1:]]), "document_ids": torch.zeros(1, length, dtype=torch.long),
             "loss_mask": torch.ones(1, length, dtype=torch.long), "position_ids": torch.arange(1, length + 1)[None]}
    call_kwargs = {"ttt_steps": K, "ttt_step_loss_decay": 1.0, "loss_config": loss_config}
    data = rows(verifier, draft)
    trainable = [p for p in draft.parameters() if p.requires_grad]

    def grads(loss):
        draft.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in trainable]

    offline = grads(draft(**batch, **call_kwargs)[1])
    on_policy = grads(rollout_loss(draft, data, loss_config, 1.0)[0])
    optimizer = torch.optim.SGD(trainable, lr=0.0)  # the step leaves the weights and their gradients as they are
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    window: dict = {}
    parts = StepParts(draft, optimizer, scheduler, trainable, 1, 1e9, torch.device("cpu"), nullcontext(), call_kwargs)
    grad_norm = train_step(parts, iter([batch]), window, [(0.3, lambda: rollout_loss(draft, data, loss_config, 1.0))])
    assert grad_norm is not None
    for p, g_off, g_on in zip(trainable, offline, on_policy):
        torch.testing.assert_close(p.grad, 0.3 * g_on + 0.7 * g_off, atol=1e-5, rtol=1e-4)
    assert float(window["rollout_accept_len_total"]) == sum(len(r.ends) for r in data)
    assert float(window["full_acc_0_total"]) > 0  # the micro-batch's metrics as well
