"""What a user who mistypes, combines options that make no sense or points at the wrong files gets: one message
naming the key or option and what it allows, a non-zero exit, nothing written. In process where it can be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from test_speedup_engine import served

from conftest import compose_cfg, launch
from eagle3.config import validate
from eagle3.errors import ConfigError
from eagle3.eval.speedup import main as speedup_main


def edit_report(path: Path, **changes) -> Path:
    """The report at `path` with `changes` (None: the key dropped)."""
    report = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({k: v for k, v in report.items() if v is not None}))
    return path


def refused_prediction(tmp_path: Path, *reports: Path, extra: tuple[str, ...] = ()) -> str:
    out = tmp_path / "prediction.json"
    with pytest.raises(SystemExit) as e:
        speedup_main(["--accept-rates", "0.3", "0.1", "--engine-costs", *map(str, reports), *extra, "--json",
                      str(out)])
    assert not out.exists()
    message = str(e.value)
    assert message.startswith("error: --engine-costs: ") and "\n" not in message
    return message


@pytest.mark.parametrize("temperature", [None, "zero", -1.0])
def test_a_serve_report_without_a_usable_temperature_is_one_message(tmp_path, temperature):
    report = edit_report(served(tmp_path, 1), temperature=temperature)
    assert "is not an eagle3.serve report" in refused_prediction(tmp_path, report)


def test_a_report_beside_the_first_that_is_no_serve_report_is_one_message(tmp_path):
    first = served(tmp_path, 1)
    (tmp_path / "serve_vllm_k2_t0.json").write_text('{"k": 2}')
    assert "serve_vllm_k2_t0.json is not an eagle3.serve report" in refused_prediction(tmp_path, first,
                                                                                        extra=("--draft-ms", "1"))


@pytest.mark.parametrize("key, other", [("checkpoint", "/runs/b/checkpoints/best"), ("verifier", "/models/other"),
                                        ("temperature", 1.0)])
def test_reports_of_two_served_runs_are_not_fitted_together(tmp_path, key, other):
    """A k=1 report of one run and a k=5 report of another (another draft, verifier or temperature: other step
    costs) would fit a line through two different engines' steps."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    run = {"checkpoint": "/runs/a/checkpoints/best", "verifier": "/models/v", "temperature": 0.0}
    one = edit_report(served(tmp_path / "a", 1), **run)
    five = edit_report(served(tmp_path / "b", 5), **{**run, key: other})
    assert "come from different served runs" in refused_prediction(tmp_path, one, five)
    edit_report(five, **run)  # the same run's reports still fit
    speedup_main(["--accept-rates", "0.3", "0.1", "--engine-costs", str(one), str(five)])


@pytest.mark.parametrize("override, allowed", [
    ("model.draft.loss=kll", "Error merging override model.draft.loss=kll: Invalid value 'kll', expected one of "
                             "[kl_div, ce, rkl, jsd, tv, nla, lk_hybrid]"),
    ("model.draft.kind=peegle", "expected one of [eagle3, peagle]"),
    ("data.on_bad_sample=maybe", "expected one of [error, skip]"),
    ("data.prefetch=x", "Value 'x' of type 'str' could not be converted to Integer"),
    ("data=nonsense", "Could not find 'data/nonsense' (options: offline, online, regenerate, tiny)"),
    ("experiment=bad", "In 'experiment/bad': ValidationError raised while composing config: Invalid value 'kll', "
                       "expected one of [kl_div, ce, rkl, jsd, tv, nla, lk_hybrid] (key model.draft.loss)"),
])
def test_a_sweep_job_whose_value_does_not_compose_is_refused_saying_what_is_allowed(tmp_path, override, allowed):
    """The sweeper refuses a sweep with one bad job's value (on the command line or in an option file) in one
    line per job; that line must say what the key takes, as a single run's message does, not only that the
    override did not merge."""
    from hydra_plugins.eagle3_basic_sweeper.sweeper import composition_problem

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "bad.yaml").write_text("# @package _global_\nmodel:\n  draft:\n    loss: kll\n")
    with pytest.raises(Exception) as e:
        compose_cfg([f"hydra.searchpath=[file://{tmp_path}]", override])
    problem = composition_problem(e.value)
    assert allowed in problem and "\n" not in problem


@pytest.mark.slow
def test_a_sweep_with_one_mistyped_enum_value_starts_no_job(tmp_path):
    sweep = tmp_path / "sweep"
    r = launch(["-m", f"hydra.sweep.dir={sweep}", "model.draft.loss=ce,kll", "plan=true"], tmp_path / "cache")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "1 of 2 sweep jobs have an invalid config; no job was started" in r.stderr
    assert "model.draft.loss=kll: Invalid value 'kll', expected one of [kl_div, ce," in r.stderr
    assert not sweep.exists()


def composed(overrides: list[str]):
    """The typed, checked config of `overrides`, as plan=true checks it (no dataset read)."""
    plain = OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True)
    return validate({str(k): v for k, v in plain.items()}, dataset_required=False)


def test_a_mask_token_for_a_draft_without_masked_slots_is_refused():
    """model.draft.mask_token_id means something to P-EAGLE only; with the default kind=eagle3 it did nothing."""
    with pytest.raises(ConfigError, match=r"^model.draft.mask_token_id: .* model.draft.kind=eagle3 has none: drop it, "
                                          r"or set model.draft.kind=peagle$"):
        composed(["model.draft.mask_token_id=5"])
    assert composed(["model.draft.kind=peagle", "model.draft.mask_token_id=5"]).model.draft.mask_token_id == 5


def test_an_infinite_accept_temperature_is_refused_in_the_run_and_the_cli():
    """T=inf divides every logit to 0: a uniform draw, whatever the verifier and the draft say."""
    from eagle3.eval.accept import main as accept_main

    with pytest.raises(ConfigError, match=r"^eval.accept.temperature: must be >= 0 and finite, got inf$"):
        composed(["eval.accept.temperature=inf"])
    with pytest.raises(SystemExit, match=r"^error: --temperature \(eval.accept.temperature\): must be >= 0 and "
                                         r"finite, got inf$"):
        accept_main(["--temperature", "inf"])


@pytest.mark.parametrize("source", ["tiny", "online"])
def test_an_infinite_synth_temperature_is_refused(source):
    """Responses drawn at T=inf are uniform noise, not the verifier's: no row would be like its output."""
    with pytest.raises(ConfigError, match=r"^data.synth.temperature: must be > 0 and finite .*, got inf$"):
        composed([f"data={source}", "data.synth.temperature=inf"])


def test_prepare_refuses_aux_layer_ids_that_name_a_layer_twice(cache_dir, tmp_path, capsys):
    """A dataset of layers [2, 2] would cost the whole verifier pass and no run could train on it (a run refuses
    model.draft.aux_layer_ids=[2,2]); refused before a file is written."""
    from eagle3.config import TinyVerifierConfig
    from eagle3.data.prepare import main as prepare_main
    from eagle3.verifier.tiny import tiny_verifier_dir

    plain = OmegaConf.to_container(compose_cfg(), resolve=True)
    verifier = tiny_verifier_dir(TinyVerifierConfig(**plain["model"]["verifier"]["tiny"]), str(cache_dir))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]}) + "\n")
    out = tmp_path / "out"
    assert prepare_main(["--model", str(verifier), "--data", str(data), "--out", str(out),
                         "--aux-layer-ids", "2", "2", "--device", "cpu"]) == 1
    assert "error: aux layer ids [2, 2] name a layer twice" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-5"])
def test_data_check_refuses_a_vocabulary_size_below_one(tmp_path, capsys, value):
    """--vocab-size 0 was taken as not given (the record's size was checked instead) and -5 counted every token
    as outside the vocabulary; either is refused before the dataset is read."""
    from eagle3.data.check import main as check_main

    with pytest.raises(SystemExit) as e:
        check_main([str(tmp_path), "--vocab-size", value])
    assert e.value.code == 2 and f"--vocab-size must be >= 1, got {value}" in capsys.readouterr().err


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


@pytest.mark.parametrize("value", ["inf", "nan", "-1"])
def test_serve_refuses_a_temperature_no_sampler_has_before_reading_the_run(tmp_path, value):
    """--temperature inf was served (vLLM samples uniformly) into serve_vllm_k<k>_tinf.json."""
    from eagle3.serve.__main__ import main as serve_main

    with pytest.raises(SystemExit, match=rf"^error: --temperature \(eval.accept.temperature\): must be >= 0 and "
                                         rf"finite, got {value}"):
        serve_main([str(tmp_path / "no-run"), "--temperature", value])


def test_flex_attention_on_the_cpu_is_refused_before_anything_is_built():
    """attn_impl=simple_flex_attention with device=cpu ran into torch's "FlexAttention does not support backward on
    CPU" traceback at the first step, leaving a failed run dir; the launcher's and the sweeper's device check
    (eagle3.run.plan_guard.check_devices) refuse it first."""
    from eagle3.run.plan_guard import check_devices

    cfg = composed(["model.draft.attn_impl=simple_flex_attention", "device=cpu"])
    with pytest.raises(ConfigError, match=r"^model.draft.attn_impl: simple_flex_attention has no backward on CPU"):
        check_devices(cfg)
    check_devices(composed(["model.draft.attn_impl=auto", "device=cpu"]))


def test_accept_refuses_an_out_path_it_cannot_write_before_measuring(tmp_path):
    """--out <a directory> measured the whole acceptance, then died with IsADirectoryError; --out under a file
    likewise (NotADirectoryError)."""
    from eagle3.eval.accept import main as accept_main

    (tmp_path / "file").write_text("")
    under_a_file = tmp_path / "file" / "r.json"
    for out, problem in ((tmp_path, f"{tmp_path} is a directory"), (under_a_file, "file is an existing file")):
        with pytest.raises(SystemExit, match=rf"^error: --out: .*{problem}.*; give the path of the JSON report"):
            accept_main(["--run", str(tmp_path / "no-run"), "--out", str(out)])


def test_a_prepare_data_path_that_is_no_file_says_what_it_is(tmp_path):
    """--data <a directory> was said not to exist; a directory is now read as a datasets dir."""
    from eagle3.errors import DataError
    from eagle3.formats.row_formats import BadSamples, read_rows

    with pytest.raises(DataError, match=rf"^{tmp_path} is not a dataset saved with datasets.save_to_disk"):
        read_rows(tmp_path, 64, 1024, BadSamples("error"))
    with pytest.raises(DataError, match=r"missing.jsonl does not exist; expected a JSONL file"):
        read_rows(tmp_path / "missing.jsonl", 64, 1024, BadSamples("error"))


@pytest.mark.slow
def test_serving_at_the_end_without_an_engine_is_refused_before_training(tmp_path):
    """eval.serve.enabled=true with an interpreter that is not there trained the whole run, then said
    "--python: ... is not an executable file"; the engine is looked for before any data is built."""
    cache, run_dir = tmp_path / "cache", tmp_path / "run"
    r = launch([f"hydra.run.dir={run_dir}", "eval.serve.enabled=true", f"eval.serve.python={tmp_path / 'python'}",
                "logger.mode=disabled"], cache)
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert f"error: eval.serve.python: {tmp_path / 'python'} is not an executable file" in r.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()
    assert not (cache / "datasets").exists()
