"""init=pretrained: both layouts, strict loading, the vocabulary policies, export, and bad checkpoints."""

from __future__ import annotations

import json
import shutil
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from commands import launch
from eagle3.config import DraftConfig, PretrainedInitConfig, VocabPolicy, lr_advice, validate
from eagle3.init import InitContext, build_draft, preflight_draft
from eagle3.init.build import meta_draft
from eagle3.init.files import CheckpointError
from eagle3.init.pretrained import SPECFORGE_FLAGS, plan_load
from eagle3.serve.export import export
from factories import SMALL_DATA, compose_cfg


@pytest.fixture(scope="module")
def run_inputs(trained_run, cache_dir):
    """The trained run's resolved config, verifier and data (the data its checkpoint was trained on)."""
    summary = json.loads((trained_run / "summary.json").read_text())
    resolved = OmegaConf.to_container(OmegaConf.load(trained_run / "resolved_config.yaml"))
    return resolved, Path(summary["verifier_dir"]), Path(summary["data_dir"])


def context(run_inputs, overrides: list[str] | None = None, **init) -> InitContext:
    resolved, verifier_dir, data_dir = run_inputs
    init_cfg = {"name": "pretrained", "key_map": {"midlayer.": "layers.0."}, "vocab": "remap",
                "train_lm_head": False, "recommended_lr": [1e-6, 3e-5], **init}
    init_cfg["vocab"] = VocabPolicy(init_cfg["vocab"])
    return InitContext(draft=DraftConfig(**resolved["model"]["draft"]), init=PretrainedInitConfig(**init_cfg),
                       verifier_dir=verifier_dir,
                       data_dir=data_dir, attn_impl="sdpa", overrides=overrides or [])


def probe_loss(run_inputs, ctx: InitContext) -> float:
    """The step-0 val loss of an initialized draft, on the trained run's val split."""
    from speculators.losses import resolve_loss_config

    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.train.validation import run_validation

    resolved, _, data_dir = run_inputs
    model, _ = build_draft(ctx)
    draft, data = resolved["model"]["draft"], resolved["data"]
    _, val = build_loaders(data_dir, LoaderSpec(data["total_seq_len"], draft["hidden_size"],
                                                len(draft["aux_layer_ids"]), data["train_ratio"], resolved["seed"]))
    kwargs = {"ttt_steps": draft["ttt_steps"], "ttt_step_loss_decay": draft["ttt_step_loss_decay"],
              "loss_config": resolve_loss_config(draft["loss"], "eager")}
    return run_validation(model, val, torch.device("cpu"), nullcontext(), kwargs)["loss"]


@pytest.fixture(scope="module")
def specforge_export(trained_run, tmp_path_factory) -> Path:
    """The trained run in the SpecForge layout. The tiny default trains with norm_before_residual=true, which SGLang
    cannot serve (its export rule refuses it); the layout is still one that init=pretrained and speculators'
    converter read, so that one rule is lifted here."""
    from eagle3.serve.parity import RULES

    out = tmp_path_factory.mktemp("export") / "specforge"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(RULES, "sglang", [r for r in RULES["sglang"] if r.name != "norm flags"])
        export(trained_run / "checkpoints" / "best", out, "specforge")
    return out


@pytest.fixture(scope="module")
def permuted(specforge_export, run_inputs, tmp_path_factory) -> Path:
    """The SpecForge export with another draft vocabulary: 64 target ids swapped for ids it lacked, lm_head rows
    moved with their tokens (new tokens get random rows), so the checkpoint is self-consistent."""
    tensors = load_file(str(specforge_export / "model.safetensors"))
    vocab = run_inputs[0]["model"]["draft"]["vocab_size"]
    old_ids = torch.arange(len(tensors["d2t"])) + tensors["d2t"]
    absent = torch.tensor(sorted(set(range(vocab)) - set(old_ids.tolist())))
    gen = torch.Generator().manual_seed(0)
    dropped = old_ids[torch.randperm(len(old_ids), generator=gen)[:64]]
    new_ids = torch.tensor(sorted(set(old_ids.tolist()) - set(dropped.tolist()) | set(absent[:64].tolist())))
    row_of = {int(t): i for i, t in enumerate(old_ids)}
    head = tensors["lm_head.weight"]
    new_head = torch.randn(len(new_ids), head.shape[1], generator=gen) * head.std()
    for j, t in enumerate(new_ids.tolist()):
        if t in row_of:
            new_head[j] = head[row_of[t]]
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[new_ids] = True
    tensors.update({"lm_head.weight": new_head.to(head.dtype), "d2t": new_ids - torch.arange(len(new_ids)),
                    "t2d": t2d})
    out = tmp_path_factory.mktemp("export") / "permuted"
    out.mkdir()
    save_file(tensors, str(out / "model.safetensors"))
    shutil.copy(specforge_export / "config.json", out / "config.json")
    return out


def test_remap_recovers_a_permuted_vocabulary_and_rebuild_does_not(trained_run, permuted, run_inputs):
    original = probe_loss(run_inputs, context(run_inputs, path=str(trained_run / "checkpoints" / "best"), vocab="keep"))
    remap = probe_loss(run_inputs, context(run_inputs, path=str(permuted), vocab="remap"))
    rebuild = probe_loss(run_inputs, context(run_inputs, path=str(permuted), vocab="rebuild"))
    print(f"\nstep-0 val loss: original {original:.4f}, remap {remap:.4f} ({remap / original:.4f}x), "
          f"rebuild {rebuild:.4f} ({rebuild / original:.4f}x)")
    assert remap == pytest.approx(original, rel=0.02)
    assert rebuild > 1.2 * original


def test_specforge_layout_loads_as_speculators_converter_converts_it(specforge_export, run_inputs, tmp_path):
    from speculators.convert.eagle.eagle3_converter import Eagle3Converter

    ctx = context(run_inputs, path=str(specforge_export), vocab="keep")
    model, report = build_draft(ctx)
    assert report["layout"] == "specforge" and len(report["keys"]["renamed"]) == 10
    flags = report["architecture"]["flags"]
    Eagle3Converter().convert(specforge_export, tmp_path / "converted", base_model=str(ctx.verifier_dir),
                              validate=False, eagle_aux_hidden_state_layer_ids=list(ctx.draft.aux_layer_ids),
                              **flags)
    converted = load_file(str(tmp_path / "converted" / "model.safetensors"))
    ours = model.state_dict()
    compared = [k for k in converted if k.startswith("layers.0.") or k == "fc.weight"]
    assert len(compared) == 11
    for key in compared:
        assert torch.equal(ours[key], converted[key].to(ours[key].dtype)), key


def test_export_then_import_round_trips_exactly(trained_run, specforge_export, run_inputs):
    original = load_file(str(trained_run / "checkpoints" / "best" / "model.safetensors"))
    model, _ = build_draft(context(run_inputs, path=str(specforge_export), vocab="keep"))
    state = model.state_dict()
    for key, tensor in original.items():
        if key != "embed_tokens.weight":  # engines take it from the verifier; it is the verifier's anyway
            assert torch.equal(state[key], tensor), key
    exported = load_file(str(specforge_export / "model.safetensors"))
    assert not any(k.startswith("layers.") for k in exported) and "midlayer.mlp.up_proj.weight" in exported


def test_report_counts_what_was_done(permuted, run_inputs):
    _, report = build_draft(context(run_inputs, path=str(permuted), vocab="remap"))
    vocab = report["vocab"]
    assert vocab["target_id_overlap"] == 512 - 64
    assert vocab["lm_head_rows_from_checkpoint"] == 512 - 64 and vocab["lm_head_rows_from_verifier"] == 64
    assert vocab["d2t_positional_differences"] > 64  # positional diffs overstate what moved
    assert 0 < vocab["data_token_share_covered_by_overlap"] < 1
    assert set(report["keys"]["skipped"]) <= {"embed_tokens.weight"}


def bad_checkpoint(kind: str, specforge_export: Path, tmp: Path) -> Path:
    out = tmp / kind
    if kind == "missing":
        return out
    shutil.copytree(specforge_export, out)
    weights = out / "model.safetensors"
    if kind == "not_safetensors":
        weights.write_bytes(b"\x80\x04\x95pickle, not safetensors")
    elif kind == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        tensors = load_file(str(weights))
        if kind == "wrong_hidden_size":
            tensors = {k: (v[:64, :192].contiguous() if k == "fc.weight" else v) for k, v in tensors.items()}
        elif kind == "wrong_vocab_size":
            tensors["t2d"] = torch.cat([tensors["t2d"], torch.zeros(1024, dtype=torch.bool)])
        save_file(tensors, str(weights))
    return out


BAD = {"missing": "does not exist", "not_safetensors": "not a safetensors file", "truncated": "truncated",
       "wrong_hidden_size": "fc.weight: checkpoint [64, 192], model [128, 384]",
       "wrong_vocab_size": "2048 tokens (t2d), the verifier 1024"}


@pytest.mark.parametrize("kind", list(BAD))
def test_bad_checkpoint_is_one_clear_error(kind, specforge_export, run_inputs, tmp_path):
    path = bad_checkpoint(kind, specforge_export, tmp_path)
    with pytest.raises(CheckpointError) as error:
        preflight_draft(context(run_inputs, path=str(path)))
    assert str(path) in str(error.value) and BAD[kind] in str(error.value), str(error.value)


def test_bad_checkpoint_stops_the_launcher_before_any_checkpoint(specforge_export, cache_dir, tmp_path):
    path = bad_checkpoint("truncated", specforge_export, tmp_path)
    run_dir = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run_dir}", "init=pretrained", f"init.path={path}", "optim.lr=1e-5",
                   "logger.mode=disabled", *SMALL_DATA], cache_dir)
    assert proc.returncode != 0 and "truncated" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (run_dir / "checkpoints").exists()


def test_architecture_mismatch_stops_unless_set_on_the_command_line(trained_run, run_inputs):
    ctx = context(run_inputs, path=str(trained_run / "checkpoints" / "best"), vocab="keep")
    ctx.draft.norm_before_fc = False  # e.g. from a model config file; the checkpoint says True
    with pytest.raises(CheckpointError, match="norm_before_fc: the run says False, the checkpoint True"):
        preflight_draft(ctx)
    ctx.overrides = ["model.draft.norm_before_fc=false"]
    ctx.draft.aux_layer_ids = [0, 1, 2]
    with pytest.raises(CheckpointError, match=r"aux_layer_ids: the run says \[0, 1, 2\], the checkpoint \[1, 2, 3\]"):
        preflight_draft(ctx)


def test_aq_medai_k2_table_maps_completely_onto_a_kimi_draft_on_meta():
    """AQ-MedAI/Kimi-K2-Instruct-eagle3's tensors (SpecForge layout) against the kimi_k25 draft, no weights."""
    draft = OmegaConf.to_container(compose_cfg(["model=kimi_k25", "model.verifier.path=/x"]).model.draft,
                                   resolve=True)
    h, heads, hd, inter, vocab, dv = 7168, 64, 128, 18432, 163840, 32000
    table = {
        "fc.weight": (h, 3 * h), "norm.weight": (h,), "lm_head.weight": (dv, h), "d2t": (dv,), "t2d": (vocab,),
        "midlayer.hidden_norm.weight": (h,), "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (heads * hd, 2 * h), "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.mlp.gate_proj.weight": (inter, h), "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
    }
    model = meta_draft(DraftConfig(**draft), SPECFORGE_FLAGS)
    assert next(model.parameters()).device.type == "meta"
    shapes = {k.replace("midlayer.", "layers.0."): v for k, v in table.items()}
    plan = plan_load(shapes, {k: tuple(v.shape) for k, v in model.state_dict().items()})
    assert plan["missing"] == plan["unexpected"] == plan["mismatched"] == []
    assert len(plan["loaded"]) == 12
    trainable = sum(p.numel() for n, p in model.named_parameters()
                    if not n.startswith(("embed", "verifier", "lm_head")))
    print(f"\nKimi-K2 draft on meta: {trainable:,} trainable parameters besides lm_head")


def test_lr_outside_the_initializers_range_is_flagged():
    resolved = OmegaConf.to_container(compose_cfg(["init=pretrained", "init.path=/x", "optim.lr=5e-5"]),
                                      resolve=True, enum_to_str=True)
    cfg = validate(resolved)
    text, outside = lr_advice(cfg.optim, cfg.init)
    assert outside and "recommends 1e-06 .. 3e-05" in text and "above" in text
    cfg.optim.lr = 2e-5
    assert not lr_advice(cfg.optim, cfg.init)[1]


def test_sharded_checkpoint_loads_like_a_single_file(specforge_export, run_inputs, tmp_path):
    tensors = load_file(str(specforge_export / "model.safetensors"))
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2],
              "model-00002-of-00002.safetensors": keys[len(keys) // 2:]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(specforge_export / "config.json", sharded / "config.json")
    for name, names in shards.items():
        save_file({k: tensors[k] for k in names}, str(sharded / name))
    index = {"metadata": {}, "weight_map": {k: name for name, names in shards.items() for k in names}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    single, _ = build_draft(context(run_inputs, path=str(specforge_export), vocab="keep"))
    split, report = build_draft(context(run_inputs, path=str(sharded), vocab="keep"))
    assert len(report["files"]) == 2
    for key, value in single.state_dict().items():
        assert torch.equal(value, split.state_dict()[key]), key


def test_a_checkpoint_of_another_kind_gets_advice_that_holds_when_the_kind_is_set_on_the_command_line(tmp_path):
    """init=pretrained from an EAGLE-3 checkpoint with model.draft.kind=peagle on the command line advised "set them on
    the command line to override the checkpoint": they were, and no override loads weights into another kind."""
    from eagle3.config import SPECULATORS_FLAGS, DraftKind
    from eagle3.init.build import bare_draft
    from eagle3.init.pretrained import preflight

    plain = OmegaConf.to_container(compose_cfg().model.draft, resolve=True)
    checkpoint = tmp_path / "ckpt"
    bare_draft(DraftConfig(**plain), SPECULATORS_FLAGS, "cpu").save_pretrained(str(checkpoint))
    ctx = InitContext(DraftConfig(**{**plain, "kind": DraftKind.peagle}), PretrainedInitConfig(path=str(checkpoint)),
                      tmp_path, tmp_path, "sdpa", ["model.draft.kind=peagle"])
    with pytest.raises(CheckpointError) as refused:
        preflight(ctx)
    said = str(refused.value)
    assert "model.draft.kind: the run says peagle, the checkpoint eagle3 (its speculators_model_type)" in said
    assert said.endswith("model.draft.kind: the checkpoint's weights are those of its own architecture and load into "
                         "no other, whatever the command line says; to start from it set model.draft.kind=eagle3, "
                         "or train this architecture with init=scratch"), said
    assert "override the checkpoint" not in said


def tiny_draft(**overrides):
    from eagle3.config import DraftConfig

    plain = OmegaConf.to_container(compose_cfg().model.draft, resolve=True)
    return DraftConfig(**{**plain, **overrides})


@pytest.mark.parametrize("run_kind, checkpoint_kind", [("peagle", "eagle3"), ("eagle3", "peagle")])
def test_a_pretrained_draft_of_the_other_kind_is_refused_naming_the_kind(tmp_path, run_kind, checkpoint_kind):
    """init=pretrained from an EAGLE-3 checkpoint into model.draft.kind=peagle (or back) said only that
    mask_hidden was missing (or unexpected); it names model.draft.kind and both kinds."""
    from eagle3.config import SPECULATORS_FLAGS, DraftKind, PretrainedInitConfig
    from eagle3.init import InitContext
    from eagle3.init.build import bare_draft
    from eagle3.init.files import CheckpointError
    from eagle3.init.pretrained import preflight

    checkpoint = tmp_path / "ckpt"
    bare_draft(tiny_draft(kind=DraftKind(checkpoint_kind)), SPECULATORS_FLAGS, "cpu").save_pretrained(str(checkpoint))
    ctx = InitContext(tiny_draft(kind=DraftKind(run_kind)), PretrainedInitConfig(path=str(checkpoint)), tmp_path,
                      tmp_path, "sdpa", [])
    with pytest.raises(CheckpointError, match=f"model.draft.kind: the run says {run_kind}, the checkpoint "
                                              f"{checkpoint_kind}"):
        preflight(ctx)
    preflight(InitContext(tiny_draft(kind=DraftKind(checkpoint_kind)), ctx.init, tmp_path, tmp_path, "sdpa", []))


def test_a_peagle_draft_initialized_from_a_peagle_checkpoint_keeps_its_trained_embedding(cache_dir, tmp_path):
    """P-EAGLE trains embed_tokens; finetuning one from a P-EAGLE checkpoint skipped it as "taken from the
    verifier, frozen", so the finetune silently started from the verifier's embedding instead of the trained one."""
    import torch

    from eagle3.config import SPECULATORS_FLAGS, DraftKind, PretrainedInitConfig, TinyVerifierConfig
    from eagle3.init import InitContext
    from eagle3.init.build import bare_draft
    from eagle3.init.pretrained import init_pretrained
    from eagle3.verifier.tiny import tiny_verifier_dir

    plain = OmegaConf.to_container(compose_cfg(), resolve=True)
    verifier = tiny_verifier_dir(TinyVerifierConfig(**plain["model"]["verifier"]["tiny"]), str(cache_dir))
    draft = tiny_draft(kind=DraftKind.peagle)
    trained = bare_draft(draft, SPECULATORS_FLAGS, "cpu")
    with torch.no_grad():
        trained.embed_tokens.weight.fill_(0.25)
        trained.d2t.zero_()  # draft slot i predicts token i
        trained.t2d.zero_()
        trained.t2d[:draft.draft_vocab_size] = True
    trained.save_pretrained(str(tmp_path / "ckpt"))
    data = tmp_path / "data"
    data.mkdir()
    torch.save({i: 1 + i % 7 for i in range(draft.vocab_size)}, data / "token_freq.pt")
    init = PretrainedInitConfig(path=str(tmp_path / "ckpt"))
    model, report = init_pretrained(InitContext(draft, init, verifier, data, "sdpa", []))
    assert "embed_tokens.weight" in report["keys"]["loaded"]
    assert torch.equal(model.embed_tokens.weight, torch.full_like(model.embed_tokens.weight, 0.25))
