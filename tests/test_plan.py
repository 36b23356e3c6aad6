"""The plan (eagle3/plan.py) against the real model and measured memory, its launcher glue, and gradient
checkpointing (eagle3/recompute.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT, launch

sys.path.insert(0, str(ROOT / "bench"))

from plan_memory import build_model, compare, draft_config, make_batch, measure, planned  # noqa: E402

from eagle3.config import DraftConfig  # noqa: E402
from eagle3.errors import ConfigError  # noqa: E402
from eagle3.plan import DEFAULT_FLAGS, buffer_bytes, parameter_counts  # noqa: E402

KIMI = DraftConfig(hidden_size=7168, intermediate_size=18432, num_attention_heads=64, num_key_value_heads=64,
                   head_dim=128, vocab_size=163840, draft_vocab_size=32000, aux_layer_ids=[2, 30, 58])
LLAMA_8B = DraftConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, vocab_size=128256, draft_vocab_size=32000, aux_layer_ids=[2, 16, 29])
TINY = DraftConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                   vocab_size=1024, draft_vocab_size=512, aux_layer_ids=[1, 2, 3], fc_norm=True, norm_before_fc=False)

# A realistic Kimi-K2.5 config.json (DeepSeek-V3 architecture), without weights: what `plan=true` reads.
KIMI_CONFIG = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": 7168,
               "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
               "first_k_dense_replace": 1, "num_attention_heads": 64, "num_key_value_heads": 64,
               "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8, "kv_lora_rank": 512,
               "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
               "vocab_size": 163840, "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "rope_theta": 50000.0,
               "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def _meta_groups(model) -> dict[str, tuple[int, bool]]:
    groups: dict[str, list] = {}
    for name, p in model.named_parameters():
        if name.startswith("layers.0.self_attn."):
            key = "decoder layer attention"
        elif name.startswith("layers.0.mlp."):
            key = "decoder layer MLP"
        elif name.startswith(("embed_tokens", "lm_head", "verifier_lm_head", "verifier_norm", "fc.")):
            key = next(k for k in parameter_counts(TINY) if k.startswith(name.split(".")[0] + " "))
        else:
            key = "norms"
        entry = groups.setdefault(key, [0, p.requires_grad])
        entry[0] += p.numel()
        assert entry[1] == p.requires_grad, name
    return {k: (n, trainable) for k, (n, trainable) in groups.items()}


@pytest.mark.parametrize("draft", [TINY, KIMI, LLAMA_8B], ids=["tiny", "kimi_k25", "llama_8b"])
def test_parameter_counts_are_those_of_speculators_model_on_the_meta_device(draft):
    from eagle3.init.build import bare_draft, resolved_flags

    model = bare_draft(draft, resolved_flags(draft, DEFAULT_FLAGS), "meta")
    assert _meta_groups(model) == parameter_counts(draft)
    assert buffer_bytes(draft) == sum(b.numel() * b.element_size() for b in model.buffers()
                                      if b.dim() == 1 and b.numel() in (draft.vocab_size, draft.draft_vocab_size))


def test_default_flags_are_the_builders():
    from eagle3.init.build import SPECULATORS_FLAGS

    assert DEFAULT_FLAGS == SPECULATORS_FLAGS


@pytest.mark.parametrize("shape", [("T512 k3 sdpa", 512, 3, "sdpa", False), ("T1024 k2 eager", 1024, 2, "eager", False),
                                   ("T768 k4 sdpa", 768, 4, "sdpa", False),
                                   ("T512 k3 sdpa ckpt", 512, 3, "sdpa", True)], ids=lambda s: s[0])
def test_planned_peak_is_within_25_percent_of_the_measured_one(shape):
    result = compare(*shape)
    assert 0.75 <= result["ratio"] <= 1.25, result


def test_gradient_checkpointing_gives_the_same_loss_and_gradients_with_less_memory():
    import torch
    from speculators.losses import resolve_loss_config

    plain_cfg, ckpt_cfg = draft_config(256, 3, "sdpa", False), draft_config(256, 3, "sdpa", True)
    batch = make_batch(plain_cfg, 256)
    kwargs = dict(ttt_steps=3, ttt_step_loss_decay=1.0, loss_config=resolve_loss_config("kl_div", "eager"))
    results = []
    for cfg in (plain_cfg, ckpt_cfg):
        model = build_model(cfg, seed=3)
        _, loss, _ = model(**batch, **kwargs)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (plain_loss, plain_grads), (ckpt_loss, ckpt_grads) = results
    assert torch.allclose(plain_loss, ckpt_loss, rtol=1e-6, atol=0)
    assert plain_grads.keys() == ckpt_grads.keys() and len(plain_grads) > 5
    for name, grad in plain_grads.items():
        assert torch.allclose(grad, ckpt_grads[name], rtol=1e-4, atol=1e-7), name
    # Less memory, measured and planned alike.
    measured_plain, measured_ckpt = measure(plain_cfg, 512)[0], measure(ckpt_cfg, 512)[0]
    planned_plain, planned_ckpt = planned(plain_cfg, 512), planned(ckpt_cfg, 512)
    assert measured_ckpt < 0.8 * measured_plain and planned_ckpt < 0.8 * planned_plain
    assert 0.75 <= (planned_plain - planned_ckpt) / (measured_plain - measured_ckpt) <= 1.5


def _resolved(overrides: list[str]):
    from common import tiny_run_config

    return tiny_run_config(overrides)


def test_a_config_that_fits_is_not_refused_and_one_that_does_not_is():
    from eagle3.launch import refuse_if_it_cannot_fit, run_plan

    refuse_if_it_cannot_fit(_resolved(["distributed.device_memory_gb=16", "device=cpu"]))  # the tiny default fits
    with pytest.raises(ConfigError) as refused:
        refuse_if_it_cannot_fit(_resolved(["distributed.device_memory_gb=0.01", "device=cpu"]))
    message = str(refused.value)
    assert "largest term is" in message and "data.total_seq_len" in message and "optim.grad_accum" in message
    assert "distributed=fsdp" in message and "gradient_checkpointing=true" in message
    assert "simple_flex_attention" in message
    plan = run_plan(_resolved(["device=cpu"]))
    assert plan.device_memory is None and "no device memory to check against" in plan.device_memory_source


def test_a_plan_needs_data_path_to_be_a_directory_but_not_to_hold_a_dataset_yet(tmp_path):
    from omegaconf import OmegaConf

    from conftest import compose_cfg
    from eagle3.config import run_config

    empty = tmp_path / "data"
    empty.mkdir()
    for path, plan_accepts in ((empty, True), (tmp_path / "missing", False)):
        plain = OmegaConf.to_container(compose_cfg(["data=offline", f"data.path={path}"]), resolve=True,
                                       enum_to_str=True)
        plain["run"] = {"dir": str(tmp_path / "run"), "name": "r", "group": "r"}
        with pytest.raises(ConfigError, match=r"data\.path"):  # a run needs the dataset in it
            run_config(plain)
        if plan_accepts:
            assert run_config(plain, dataset_required=False).data.path == str(path)
        else:
            with pytest.raises(ConfigError, match="does not exist"):
                run_config(plain, dataset_required=False)


def test_fsdp_shards_the_states_and_checkpointing_shrinks_activations():
    from eagle3.launch import run_plan

    base = ["distributed=ddp", "distributed.nproc_per_node=8", "distributed.device_memory_gb=141", "device=cuda"]
    ddp = run_plan(_resolved(base))
    fsdp = run_plan(_resolved(base + ["distributed.strategy=fsdp"]))
    ckpt = run_plan(_resolved(base + ["model.draft.gradient_checkpointing=true"]))
    by_name = lambda plan: {t.name.split(" (")[0]: t.bytes for t in plan.terms}  # noqa: E731
    assert by_name(fsdp)["AdamW state"] * 8 == pytest.approx(by_name(ddp)["AdamW state"], rel=1e-3)
    assert ckpt.peak < ddp.peak and ckpt.step_seconds > ddp.step_seconds
    assert ddp.tokens_per_step == 8 * 1024


@pytest.fixture
def kimi_dirs(tmp_path) -> tuple[Path, Path]:
    verifier, data = tmp_path / "kimi-k25", tmp_path / "data"
    verifier.mkdir()
    data.mkdir()
    (verifier / "config.json").write_text(json.dumps(KIMI_CONFIG))
    return verifier, data


@pytest.mark.slow
def test_plan_true_prints_the_kimi_plan_without_weights_data_or_a_run_dir(kimi_dirs, tmp_path, cache_dir):
    verifier, data = kimi_dirs
    run_dir = tmp_path / "outputs" / "plan"
    proc = launch(["plan=true", "experiment=kimi_k25_scratch", f"model.verifier.path={verifier}",
                   f"data.path={data}", "distributed.device_memory_gb=141", f"hydra.run.dir={run_dir}"], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "plan per rank: 8 rank(s), ddp, cuda, attention simple_flex_attention" in out
    assert "961,594,368 trainable" in out and "AdamW state" in out and "fits" in out
    assert "per-step figures only" in out and "tokens per optimizer step: 131,072" in out
    assert not run_dir.exists()


@pytest.mark.slow
def test_plan_true_on_the_tiny_default_exits_0_without_a_run_dir(tmp_path, cache_dir):
    run_dir = tmp_path / "outputs" / "tiny-plan"
    proc = launch(["plan=true", f"hydra.run.dir={run_dir}"], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "peak on the device" in proc.stdout and "steps: about" in proc.stdout
    assert not run_dir.exists()
    # A refused config leaves no run dir either, and says why in one line.
    refused = launch(["plan=true", "data=offline", f"data.path={tmp_path / 'typo'}", f"hydra.run.dir={run_dir}"],
                     cache_dir)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: data.path: {tmp_path / 'typo'} does not exist"), \
        refused.stderr[-2000:]
    assert not run_dir.exists()


@pytest.mark.slow
def test_a_kimi_run_on_16_gb_stops_before_any_rank_with_one_message(kimi_dirs, tmp_path, cache_dir):
    verifier, data = kimi_dirs
    (data / "hidden_states").mkdir()  # passes the config check; the plan stops the run before data is read
    run_dir = tmp_path / "outputs" / "kimi-16gb"
    proc = launch(["experiment=kimi_k25_scratch", f"model.verifier.path={verifier}", f"data.path={data}",
                   "distributed.device_memory_gb=16", f"hydra.run.dir={run_dir}"], cache_dir)
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "GiB per rank" in errors[0] and "distributed=fsdp" in errors[0], proc.stderr[-2000:]
    assert not (run_dir / "resolved_config.yaml").exists()


@pytest.mark.slow
def test_the_plan_counts_an_offline_datasets_steps_and_bytes(trained_run):
    from eagle3.launch import run_plan

    summary = json.loads((trained_run / "summary.json").read_text())
    data_dir = Path(summary["data_dir"])
    plan = run_plan(_resolved(["data=offline", f"data.path={data_dir}", "data.total_seq_len=512",
                               "data.train_ratio=0.9", "optim.epochs=2", "device=cpu"]))
    # The run trained 2 epochs of the same rows at the same total_seq_len (tests/conftest.py SMALL_DATA).
    assert plan.total_steps == summary["steps"]
    hidden = sum(f.stat().st_size for f in (data_dir / "hidden_states").glob("*.safetensors"))
    assert any(f"{hidden / 2**30:.2f} GiB in all" in note for note in plan.data_notes)
