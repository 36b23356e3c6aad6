"""The plan (eagle3/plan/memory.py) against the real model and measured memory, its launcher glue, and gradient
checkpointing (eagle3/arch/activation_checkpointing.py)."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest

from commands import launch
from factories import ROOT, parameter_groups, tiny_run_config, verifier_config_dir, verifier_model

sys.path.insert(0, str(ROOT / "bench"))

from plan_memory import build_model, compare, draft_config, live_bytes_mode, make_batch, measure, planned  # noqa: E402

from eagle3.arch.draft import SPECULATORS_FLAGS  # noqa: E402
from eagle3.config import DraftConfig  # noqa: E402
from eagle3.errors import ConfigError  # noqa: E402
from eagle3.plan.memory import buffer_bytes, parameter_counts  # noqa: E402

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


@pytest.mark.parametrize("draft", [TINY, KIMI, LLAMA_8B], ids=["tiny", "kimi_k25", "llama_8b"])
def test_parameter_counts_are_those_of_speculators_model_on_the_meta_device(draft):
    from eagle3.arch.draft import resolved_flags
    from eagle3.init.build import bare_draft

    model = bare_draft(draft, resolved_flags(draft, SPECULATORS_FLAGS), "meta")
    assert parameter_groups(model, draft) == parameter_counts(draft)
    assert buffer_bytes(draft) == sum(b.numel() * b.element_size() for b in model.buffers()
                                      if b.dim() == 1 and b.numel() in (draft.vocab_size, draft.draft_vocab_size))


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
    from factories import tiny_run_config

    return tiny_run_config(overrides)


def test_a_config_that_fits_is_not_refused_and_one_that_does_not_is():
    from eagle3.run.plan_guard import refuse_if_it_cannot_fit, run_plan

    refuse_if_it_cannot_fit(_resolved(["distributed.device_memory_gb=16", "device=cpu"]))  # the tiny default fits
    with pytest.raises(ConfigError) as refused:
        refuse_if_it_cannot_fit(_resolved(["distributed.device_memory_gb=0.01", "device=cpu"]))
    message = str(refused.value)
    assert "largest term is" in message and "data.total_seq_len" in message and "optim.grad_accum" in message
    assert "distributed=fsdp" in message and "gradient_checkpointing=true" in message
    assert "simple_flex_attention" in message
    plan = run_plan(_resolved(["device=cpu"]))  # the host's memory is the CPU device's
    assert plan.device_memory and plan.device_memory > 0 and "host memory available" in plan.device_memory_source


def test_a_plan_needs_data_path_to_be_a_directory_but_not_to_hold_a_dataset_yet(tmp_path):
    from omegaconf import OmegaConf

    from eagle3.config import run_config
    from factories import compose_cfg

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
    from eagle3.run.plan_guard import run_plan

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
    verifier, data = verifier_config_dir(tmp_path / "kimi-k25", **KIMI_CONFIG), tmp_path / "data"
    data.mkdir()
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
    assert "peak on the device" in proc.stdout
    # The run's own count (eagle3/formats/packing.py): 460 train rows of 128 tokens, 8 to a 1,024-token micro-batch.
    assert "steps: 58 per epoch (the rows packed as the run packs them), 174 in the run" in proc.stdout
    assert not run_dir.exists()
    # A refused config leaves no run dir either, and says why in one line; the dir above the run dir it was given,
    # the user's own, stays.
    run_dir.parent.mkdir(exist_ok=True)
    refused = launch(["plan=true", "data=offline", f"data.path={tmp_path / 'typo'}", f"hydra.run.dir={run_dir}"],
                     cache_dir)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: data.path: {tmp_path / 'typo'} does not exist"), \
        refused.stderr[-2000:]
    assert not run_dir.exists()
    assert run_dir.parent.is_dir()


# Kimi-K2.5's config.json as published: a multimodal wrapper with the DeepSeek-V3 decoder's sizes under text_config.
KIMI_K25_CONFIG = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                   "text_config": KIMI_CONFIG, "vision_config": {"model_type": "moonvit", "hidden_size": 1152}}


@pytest.mark.slow
def test_plan_true_of_kimi_k25s_own_config_with_eval_accept_sizes_its_decoder_and_refuses_one_gpu(tmp_path,
                                                                                                   cache_dir):
    """The reproduction of a KeyError: 'hidden_size' (the plan read the wrapper's top level): the decoder is read
    from text_config, and the verifier eval.accept loads on rank 0 is counted with all its experts."""
    from eagle3.config import VerifierConfig
    from eagle3.plan.sizes import shape_from_config, verifier_size

    verifier, data = _verifier_dir(tmp_path, "kimi-k25", KIMI_K25_CONFIG), tmp_path / "data"
    data.mkdir()
    proc = launch(["plan=true", "experiment=kimi_k25_scratch", f"model.verifier.path={verifier}", f"data.path={data}",
                   "eval.accept.enabled=true", "distributed.device_memory_gb=141"], cache_dir)
    assert proc.returncode == 3, proc.stderr[-3000:]  # the plan's "does not fit"
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr
    params = shape_from_config(KIMI_CONFIG, "").params  # about 1.03 T: 384 experts in each of 60 MoE layers
    assert verifier_size(VerifierConfig(path=str(verifier))) == (2 * params, "estimated from config.json in bf16 "
                                                                             "(no weights present)")
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("  verifier in the training process")]
    assert f"{2 * params / 2**30:.3f} GiB" in line and "estimated from config.json" in line
    assert "961,594,368 trainable" in proc.stdout  # the draft of a 7168-wide decoder
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "more than the device holds. Instead: eval.accept.enabled=false" in errors[0]


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
    from eagle3.run.plan_guard import run_plan

    summary = json.loads((trained_run / "summary.json").read_text())
    data_dir = Path(summary["data_dir"])
    plan = run_plan(_resolved(["data=offline", f"data.path={data_dir}", "data.total_seq_len=512",
                               "data.train_ratio=0.9", "optim.epochs=2", "device=cpu"]))
    # The run trained 2 epochs of the same rows at the same total_seq_len (tests/factories.py SMALL_DATA).
    assert plan.total_steps == summary["steps"]
    hidden = sum(f.stat().st_size for f in (data_dir / "hidden_states").glob("*.safetensors"))
    assert any(f"{hidden / 2**30:.2f} GiB in all" in note for note in plan.data_notes)


# >>> data=online: the verifier in every rank (eagle3.plan.memory.verifier_terms, eagle3.plan.sizes.verifier_shape)
LLAMA_8B_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
                   "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
                   "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 128256, "max_position_embeddings": 131072,
                   "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
                   "torch_dtype": "bfloat16"}
LLAMA_8B_PARAMS = 8_030_261_248  # meta-llama/Llama-3.1-8B-Instruct, as its model card and safetensors index state
LLAMA_70B_CONFIG = {**LLAMA_8B_CONFIG, "hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80,
                    "num_attention_heads": 64}
EIGHT_H200 = ["distributed=ddp", "distributed.nproc_per_node=8", "distributed.device_memory_gb=141"]


def _verifier_dir(tmp_path: Path, name: str, config: dict) -> Path:
    return verifier_config_dir(tmp_path / name, **config)


def _planned_config(overrides: list[str]):
    """The typed config as plan=true types it (launch.show_plan): data.path need not hold rows yet."""
    from omegaconf import OmegaConf

    from eagle3.config import run_config
    from factories import compose_cfg

    plain = OmegaConf.to_container(compose_cfg(["logger.mode=disabled", *overrides]), resolve=True, enum_to_str=True)
    plain["run"] = {"dir": "", "name": "plan", "group": "plan", "choices": {}, "overrides": []}
    return run_config(plain, dataset_required=False)


def _terms(plan) -> dict[str, int]:
    return {t.name: t.bytes for t in plan.terms}


def _term(plan, prefix: str) -> int:
    (found,) = [t.bytes for t in plan.terms if t.name.startswith(prefix)]
    return found


def test_an_online_plan_holds_the_verifier_in_every_rank_and_shard_verifier_divides_it(tmp_path):
    from eagle3.run.plan_guard import run_plan

    verifier = _verifier_dir(tmp_path, "llama-8b", LLAMA_8B_CONFIG)
    online = ["model=llama3_8b", f"model.verifier.path={verifier}", "data=online",
              f"data.path={tmp_path / 'rows-not-there-yet.jsonl'}", "data.total_seq_len=8192", *EIGHT_H200]
    full = run_plan(_planned_config(online))
    sharded = run_plan(_planned_config(online + ["data.shard_verifier=true"]))
    offline = run_plan(_planned_config(["model=llama3_8b", f"model.verifier.path={verifier}", "data=offline",
                                        f"data.path={tmp_path}", "data.total_seq_len=8192", *EIGHT_H200]))

    # A full copy per rank: 8.03 B params in bf16; sharded: 1/8 of them without the lm_head, which it drops.
    assert _term(full, "verifier weights (8.030 B params, bf16), a full copy per rank") == 2 * LLAMA_8B_PARAMS
    lm_head = 128256 * 4096
    assert _term(sharded, "verifier weights") == 2 * math.ceil((LLAMA_8B_PARAMS - lm_head) / 8)
    assert "sharded over 8" in next(t.name for t in sharded.terms if t.name.startswith("verifier weights"))
    # What FSDP2 gathers on top: the root (embedding, final norm) for good, two decoder layers during the forward.
    assert _term(sharded, "verifier embedding + final norm") == 2 * (128256 * 4096 + 4096)
    layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096
    assert _term(sharded, "verifier decoder layers all-gathered") == 2 * 2 * layer
    assert full.peak - sharded.peak > 0.8 * 2 * LLAMA_8B_PARAMS * 7 / 8
    assert full.fits() and sharded.fits()

    # The offline reader's ring is gone; one buffer per loader on the device instead.
    assert any(name.startswith("hidden-state ring") for name in _terms(offline))
    for plan in (full, sharded):
        names = _terms(plan)
        assert not any(name.startswith("hidden-state ring") for name in names)
        assert names["online hidden-state buffers: 2 x (T+1) x 4 x H (bfloat16)"] == 2 * 8193 * 4 * 4096 * 2
    # The verifier's forward and the draft's step do not overlap: the peak counts the larger phase only.
    always = sum(t.bytes for t in full.terms if t.on_device and not t.phase)
    assert full.peak == always + max(full.phase_bytes().values())
    assert set(full.phase_bytes()) == {"draft step", "verifier forward"}
    assert full.verifier_flops_per_step > 0 and full.step_seconds > offline.step_seconds
    # No hidden states on disk online; the notes say what offline data would have stored (32 KiB per token).
    assert any("none (data=online" in note and "32,768 bytes/token" in note for note in full.data_notes)
    assert any("not counted before a run reads" in note for note in full.data_notes)


def test_online_eval_accept_reuses_the_verifier_and_offline_loads_it_on_rank_0(tmp_path):
    from eagle3.run.plan_guard import run_plan

    verifier = _verifier_dir(tmp_path, "llama-8b", LLAMA_8B_CONFIG)
    base = ["model=llama3_8b", f"model.verifier.path={verifier}", "eval.accept.enabled=true",
            "distributed.device_memory_gb=141"]
    online = run_plan(_planned_config(base + ["data=online", f"data.path={tmp_path / 'rows.jsonl'}"]))
    offline = run_plan(_planned_config(base + ["data=offline", f"data.path={tmp_path}"]))
    assert [t.name for t in online.terms if t.name.startswith("verifier") and "forward:" not in t.name] == \
        ["verifier weights (8.030 B params, bf16), a full copy per rank"]
    assert "verifier in the training process (rank 0)" in _terms(offline)
    assert not any(name.startswith("verifier weights") for name in _terms(offline))


@pytest.mark.parametrize("gb, advice", [(16, "more than the device holds. Instead: eval.accept.enabled=false"),
                                         (24, "To shrink it: eval.accept.enabled=false")])
def test_a_run_that_does_not_fit_for_eval_accepts_verifier_is_told_to_measure_acceptance_afterwards(tmp_path, gb,
                                                                                                     advice):
    """8B in bf16 is 15.0 GiB: at 16 GB more than the device holds (the draft's knobs cannot help), at 24 GB the
    largest of a 36.9 GiB peak."""
    from eagle3.errors import ConfigError
    from eagle3.plan.report import check_fits
    from eagle3.run.plan_guard import run_plan

    verifier = _verifier_dir(tmp_path, "llama-8b", LLAMA_8B_CONFIG)
    plan = run_plan(_planned_config(["model=llama3_8b", f"model.verifier.path={verifier}", "eval.accept.enabled=true",
                                     "data=offline", f"data.path={tmp_path}", f"distributed.device_memory_gb={gb}"]))
    with pytest.raises(ConfigError, match=re.escape(advice)) as refusal:
        check_fits(plan)
    assert "eagle3 accept --run <run dir>" in str(refusal.value)


def test_on_policy_rollouts_hold_the_verifier_in_every_rank_and_eval_accept_reuses_it(tmp_path):
    from eagle3.errors import ConfigError
    from eagle3.plan.report import check_fits
    from eagle3.run.plan_guard import run_plan

    verifier = _verifier_dir(tmp_path, "llama-8b", LLAMA_8B_CONFIG)
    base = ["model=llama3_8b", f"model.verifier.path={verifier}", "data=offline", f"data.path={tmp_path}",
            "train.on_policy.enabled=true", "distributed=ddp", "distributed.nproc_per_node=2"]
    for extra in ([], ["eval.accept.enabled=true"]):
        plan = run_plan(_planned_config([*base, *extra, "distributed.device_memory_gb=141"]))
        held = [t for t in plan.terms if t.name.startswith("verifier")]
        assert [t.name for t in held] == ["verifier for on-policy rollouts (every rank)"], extra
        assert held[0].bytes == 2 * 8_030_261_248  # bf16, counted from config.json
    plan = run_plan(_planned_config([*base, "distributed.device_memory_gb=16"]))
    with pytest.raises(ConfigError, match=r"more than the device holds\. Instead: train\.on_policy\.enabled=false"):
        check_fits(plan)


def test_the_fit_guard_refuses_an_online_verifier_that_does_not_fit_and_says_what_does(tmp_path):
    from eagle3.run.plan_guard import refuse_if_it_cannot_fit

    verifier = _verifier_dir(tmp_path, "llama-70b", LLAMA_70B_CONFIG)
    online = ["model=auto", f"model.verifier.path={verifier}", "data=online", f"data.path={tmp_path / 'rows.jsonl'}",
              "data.total_seq_len=8192", *EIGHT_H200]
    with pytest.raises(ConfigError) as refused:  # 70.6 B params x 2 bytes = 131 GiB on each rank
        refuse_if_it_cannot_fit(_planned_config(online))
    message = str(refused.value)
    assert "the verifier data=online holds in every rank takes 131.4 GiB" in message
    assert "more than the device holds" in message
    assert "data.shard_verifier=true (its weights divided over the 8 ranks" in message
    assert "offline data" in message and "data=offline" in message and "vLLM" in message
    assert "distributed=fsdp" not in message  # the draft's knobs cannot help
    refuse_if_it_cannot_fit(_planned_config(online + ["data.shard_verifier=true"]))  # fits, sharded
    # On one rank sharding needs more ranks first.
    with pytest.raises(ConfigError, match=r"shard_verifier=true over more ranks.*offline data"):
        refuse_if_it_cannot_fit(_planned_config(online[:-3] + ["distributed.device_memory_gb=141"]))


def test_an_online_plan_counts_the_tokens_of_sampled_and_arrow_rows_and_no_hidden_bytes(tmp_path):
    from datasets import Dataset

    from eagle3.run.plan_guard import run_plan

    sampled = run_plan(_planned_config(["data=online", "device=cpu"]))
    tiny_verifier_params = 2 * 1024 * 128 + 4 * (4 * 128 * 128 + 3 * 128 * 256 + 2 * 128) + 128
    assert _term(sampled, "verifier weights (0.919 M params, fp32)") == 4 * tiny_verifier_params  # fp32 on CPU
    assert sampled.total_steps == 174  # the README's 174 steps of the tiny default, online as offline
    assert sampled.data_notes[0] == "dataset: 460 train rows, 58,880 train tokens of 65,536"
    assert "hidden states on disk: none (data=online computes them in the loop)" in sampled.data_notes[1]
    assert "1,024 bytes/token (4 x H x bfloat16), 0.06 GiB for these tokens" in sampled.data_notes[1]

    rows = tmp_path / "rows"
    lengths = [30, 50, 70, 90, 110, 130, 150, 170, 190, 210]
    Dataset.from_dict({"input_ids": [[1] * n for n in lengths], "loss_mask": [[1] * n for n in lengths],
                       "seq_len": lengths}).save_to_disk(str(rows))
    (rows / "hidden_states").mkdir()
    (rows / "hidden_states" / "hs_0.safetensors").write_bytes(b"x" * 4096)  # present, not read online
    arrow = run_plan(_planned_config(["data=online", f"data.path={rows}", "data.train_ratio=0.8", "device=cpu"]))
    assert arrow.data_notes[0] == f"dataset: 8 train rows, {sum(lengths[:8]):,} train tokens of {sum(lengths):,}"
    assert arrow.data_notes[1].startswith("hidden states on disk: none")


def test_an_online_plan_counts_the_disk_data_cache_gb_takes_for_the_train_rows():
    """data.cache_gb: the train rows' hidden states in bytes (58,880 tokens x 1,024 bytes), all of them within a
    1 GB budget, a share of them within a smaller one."""
    from eagle3.run.plan_guard import run_plan

    def note(gb: float) -> str:
        notes = run_plan(_planned_config(["data=online", "device=cpu", "optim.epochs=2", f"data.cache_gb={gb}"]))
        return notes.data_notes[2]

    assert note(1).startswith("data.cache_gb=1: the train rows' hidden states kept in the run dir")
    assert "0.06 GiB on disk while the run lasts (100% of the train tokens' 0.06 GiB" in note(1)
    assert "0.03 GiB on disk while the run lasts (50% of the train tokens' 0.06 GiB" in note(58_880 * 1024 / 2e9)
    assert len(run_plan(_planned_config(["data=online", "device=cpu"])).data_notes) == 2  # off: no note


def _meta_params(config) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_the_verifier_shape_counts_the_parameters_transformers_builds():
    from transformers import DeepseekV3Config, LlamaConfig

    from eagle3.config import TinyVerifierConfig, VerifierConfig
    from eagle3.plan.sizes import shape_from_config, verifier_shape

    tiny = TinyVerifierConfig()
    assert verifier_shape(VerifierConfig(path=None, tiny=tiny)).params == _meta_params(LlamaConfig(
        vocab_size=tiny.vocab_size, hidden_size=tiny.hidden_size, intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers, num_attention_heads=tiny.num_heads, tie_word_embeddings=False))
    gqa = {**LLAMA_8B_CONFIG, "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 3,
           "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 1000}
    assert shape_from_config(gqa, "").params == _meta_params(LlamaConfig(**gqa))
    assert shape_from_config({**gqa, "tie_word_embeddings": True}, "").params == \
        _meta_params(LlamaConfig(**{**gqa, "tie_word_embeddings": True}))
    assert shape_from_config(LLAMA_8B_CONFIG, "").params == LLAMA_8B_PARAMS
    # DeepSeek-V3's latent attention and experts (Kimi-K2.5's decoder), small: a dense first layer, then MoE.
    small_kimi = {**KIMI_CONFIG, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 64,
                  "num_hidden_layers": 3, "first_k_dense_replace": 1, "num_attention_heads": 4,
                  "num_key_value_heads": 4, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2,
                  "kv_lora_rank": 32, "q_lora_rank": 48, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8,
                  "v_head_dim": 16, "vocab_size": 1000, "n_group": 1, "topk_group": 1}
    shape = shape_from_config(small_kimi, "")
    assert shape.params == _meta_params(DeepseekV3Config(**small_kimi))
    assert shape.layer_params > (shape.params - shape.embedding - shape.lm_head) / 3  # a MoE layer is the largest
    # Kimi-K2.5 itself: about a trillion parameters (2 TB in bf16), 61 layers.
    assert 1.0e12 < shape_from_config(KIMI_CONFIG, "").params < 1.05e12


def test_the_verifier_shape_reads_safetensors_headers_unless_quantized(tmp_path):
    import torch
    from safetensors.torch import save_file

    from eagle3.config import VerifierConfig
    from eagle3.plan.sizes import verifier_shape

    gqa = {**LLAMA_8B_CONFIG, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100}
    verifier = _verifier_dir(tmp_path, "v", gqa)
    save_file({"a": torch.zeros(10, 7), "b": torch.zeros(3)}, str(verifier / "model-00001.safetensors"))
    save_file({"c": torch.zeros(2, 2, 2, dtype=torch.bfloat16)}, str(verifier / "model-00002.safetensors"))
    shape = verifier_shape(VerifierConfig(path=str(verifier)))
    assert shape.params == 70 + 3 + 8 and "safetensors headers" in shape.source
    verifier_config_dir(verifier, **gqa, quantization_config={"quant_method": "fp8"})
    shape = verifier_shape(VerifierConfig(path=str(verifier)))
    assert shape.params > 70 + 3 + 8 and "quantized" in shape.source  # counted from config.json instead
    verifier_config_dir(verifier, model_type="gpt2", n_embd=64, n_layer=2)
    with pytest.raises(ConfigError, match=r"config\.json has no 'hidden_size'"):
        verifier_shape(VerifierConfig(path=str(verifier)))


@pytest.mark.parametrize("docs", [[1025], [400, 350, 276]], ids=["one row", "three padded rows"])
def test_the_verifiers_planned_forward_is_within_25_percent_of_the_measured_one(docs):
    """The online verifier's forward over one micro-batch (T = 1024) on CPU, measured as bench/plan_memory.py measures
    the draft's step (the bytes of live tensor storages), against the plan's verifier-forward phase."""
    import torch

    from eagle3.config import OnlineDataConfig
    from eagle3.data.online import OnlineVerifier
    from eagle3.plan.memory import verifier_terms
    from eagle3.plan.parts import VERIFIER_FORWARD
    from eagle3.plan.sizes import shape_from_config

    config = dict(hidden_size=256, intermediate_size=896, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=2, head_dim=32, vocab_size=1000, tie_word_embeddings=False)
    model = verifier_model(0, **config, attn_implementation="sdpa").eval().requires_grad_(False)
    verifier = OnlineVerifier(model, [1, 2, 3])
    rows = [torch.randint(0, 1000, (n,)).tolist() for n in docs]
    verifier(rows)  # a first forward, as the measured draft step follows one
    tracker = live_bytes_mode()
    tracker.track(list(model.parameters()), list(model.buffers()))
    weights = tracker.live
    with tracker:
        verifier(rows)
    measured = tracker.peak - weights

    shape = shape_from_config(config, "")
    assert shape.params * 4 <= weights <= shape.params * 4 + 1024  # fp32 weights, plus rotary's inverse frequencies
    draft = DraftConfig(hidden_size=256, intermediate_size=896, num_attention_heads=8, num_key_value_heads=2,
                        head_dim=32, vocab_size=1000, draft_vocab_size=500, aux_layer_ids=[1, 2, 3])
    data = OnlineDataConfig(total_seq_len=1024)
    planned_forward = sum(t.bytes for t in verifier_terms(shape, draft, data, 1, "cpu", False)
                          if t.phase == VERIFIER_FORWARD)
    assert 0.75 <= planned_forward / measured <= 1.25, (planned_forward, measured)


def test_the_plan_times_a_step_at_this_machines_cached_kernel_rates_and_names_their_source(tmp_path):
    """plan=true's step time comes from the rates cached for this machine (eagle3.plan.roofline), named with where they
    came from; without any, an assumed share of a peak, said so; asked to measure, it measures and caches them."""
    from eagle3.plan.report import format_plan
    from eagle3.plan.roofline import Rates, cache_file, machine_key, shape_key
    from eagle3.plan.step_time import step_matmuls
    from eagle3.run.plan_guard import run_plan
    from factories import tiny_run_config

    cfg = tiny_run_config(["device=cpu", f"cache_dir={tmp_path / 'cache'}"])
    assert "assumed" in run_plan(cfg).rate_note  # nothing cached, nothing measured
    kernels = step_matmuls(cfg.model.draft, cfg.data.total_seq_len, False, False, "sdpa")
    key = machine_key("cpu")
    file = cache_file(tmp_path / "cache", key)
    Rates(key, {shape_key(k.shape): 2e9 for k in kernels}, "2026-01-02 03:04 UTC", file).save()
    plan = run_plan(cfg)
    assert plan.step_seconds == pytest.approx(sum(k.flops for k in kernels) / 2e9)
    assert "measured 2026-01-02 03:04 UTC" in plan.rate_note and str(file) in plan.rate_note
    assert plan.rate_note in format_plan(plan)
    file.unlink()
    measured = run_plan(cfg, measure=True)
    assert "measured now" in measured.rate_note and file.is_file()
    assert set(json.loads(file.read_text())["rates"]) == {shape_key(k.shape) for k in kernels}


def test_an_online_plan_imports_no_torch(tmp_path):
    """plan=true stays as light online as offline: headers and config.json only."""
    import subprocess

    verifier = _verifier_dir(tmp_path, "llama-8b", LLAMA_8B_CONFIG)
    code = ("import sys; sys.path[:0] = ['tests/plan', 'tests', 'bench']\n"
            "from test_plan import _planned_config\n"
            "from eagle3.run.plan_guard import run_plan\n"
            f"plan = run_plan(_planned_config(['model=llama3_8b', 'model.verifier.path={verifier}', 'data=online', "
            f"'data.path={tmp_path / 'rows.jsonl'}', 'distributed.device_memory_gb=141']))\n"
            "assert plan.online_verifier == 'full', plan\n"
            "heavy = sorted(m for m in ('torch', 'speculators', 'transformers', 'datasets') if m in sys.modules)\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.slow
def test_plan_true_online_prints_the_sharded_kimi_verifier_per_rank_and_a_run_is_refused(kimi_dirs, tmp_path,
                                                                                          cache_dir):
    verifier, _ = kimi_dirs
    run_dir = tmp_path / "outputs" / "online-plan"
    online = ["model=kimi_k25", f"model.verifier.path={verifier}", "data=online", *EIGHT_H200,
              f"hydra.run.dir={run_dir}"]
    proc = launch(["plan=true", f"data.path={tmp_path / 'rows-to-come.jsonl'}", "data.shard_verifier=true",
                   *online], cache_dir)
    assert proc.returncode == 3, proc.stderr[-3000:]  # printed, and it does not fit
    assert "verifier weights (1025.234 B params without lm_head, bf16), sharded over 8" in proc.stdout
    assert "DOES NOT FIT" in proc.stdout and "hidden-state ring" not in proc.stdout
    assert "hidden states on disk: none (data=online" in proc.stdout and "57,344 bytes/token" in proc.stdout
    assert not run_dir.exists()
    # The same as a run on one rank: stopped before anything is built, with one message.
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}\n')
    refused = launch([f"data.path={rows}", *online[:3], "distributed.device_memory_gb=141",
                      f"hydra.run.dir={run_dir}"], cache_dir)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, refused.stderr[-2000:]
    assert "the verifier data=online holds in every rank takes 1911.8 GiB" in errors[0]
    assert "data.shard_verifier=true over more ranks" in errors[0] and "offline data" in errors[0]
    assert not (run_dir / "resolved_config.yaml").exists()
# <<< data=online


def test_on_cpu_the_fit_guard_checks_the_hosts_memory():
    from eagle3.plan.sizes import device_and_memory
    from eagle3.run.plan_guard import refuse_if_it_cannot_fit, run_plan

    kind, one, source = device_and_memory("cpu", None)
    assert kind == "cpu" and one and one > 2 ** 20 and "host memory" in source
    two = device_and_memory("cpu", None, ranks_per_node=2)[1]
    assert two and abs(2 * two - one) < 0.05 * one  # two ranks on the node share it
    assert device_and_memory("cpu", 16.0)[1] == 16 * 10 ** 9  # given by hand, taken as given
    refuse_if_it_cannot_fit(tiny_run_config(["device=cpu"]))  # the tiny default fits
    huge = tiny_run_config(["device=cpu", "data.total_seq_len=200000"])  # about 900 GiB of attention masks
    assert run_plan(huge).device_memory == pytest.approx(one, rel=0.05)
    with pytest.raises(ConfigError, match="host memory available"):
        refuse_if_it_cannot_fit(huge)


def test_a_plan_that_does_not_fit_says_its_exit_status():
    from eagle3.plan.report import NO_FIT_STATUS, format_plan
    from eagle3.run.plan_guard import run_plan

    text = format_plan(run_plan(tiny_run_config(["device=cpu", "distributed.device_memory_gb=0.01"])))
    assert f"DOES NOT FIT (limit 95%; exit status {NO_FIT_STATUS})" in text and NO_FIT_STATUS not in (0, 1)


@pytest.mark.slow
def test_plan_true_exits_3_when_the_plan_does_not_fit_and_0_when_it_does(tmp_path):
    run_dir = tmp_path / "plan"
    fits = launch(["plan=true", "device=cpu", "distributed.device_memory_gb=16", f"hydra.run.dir={run_dir}"],
                  tmp_path / "cache")
    assert fits.returncode == 0 and "fits" in fits.stdout, fits.stderr[-2000:]
    too_big = launch(["plan=true", "device=cpu", "distributed.device_memory_gb=0.01", f"hydra.run.dir={run_dir}"],
                     tmp_path / "cache")
    assert too_big.returncode == 3 and "DOES NOT FIT" in too_big.stdout, too_big.stderr[-2000:]
    errors = [line for line in too_big.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "largest term" in errors[0] and "Traceback" not in too_big.stderr
    assert not run_dir.exists()
    helped = launch(["--help"], tmp_path / "cache")
    assert helped.returncode == 0 and "plan=true exits 0 when the plan fits the device, 3 when it does not" in \
        " ".join(helped.stdout.split())
