"""Input no run can use, said in one message where it is read: verifier configs no model could have or the draft
cannot mirror, plans that do not fit (the CPU host's memory included; plan=true's exit status), speedup and
acceptance options out of range, a data.path that is not a file or dir, run dirs holding symlinks that lead out."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import launch, tiny_run_config
from eagle3.errors import ConfigError, UserError

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
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({**GOOD, **changes}))
    return path


# --- a verifier config no model could have: one message where the config is read --------------------------------

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


# --- a verifier whose norms the draft cannot mirror ------------------------------------------------------------

def test_every_reader_of_a_verifiers_sizes_takes_a_multimodal_wrappers_text_config(tmp_path):
    """Kimi-K2.5 and Qwen3-VL nest the decoder under text_config: the shape reader, the data's fingerprint, the online
    rows' position bound, regeneration's end-of-sequence ids and the export's parity check all read it there."""
    from eagle3.data.online import verifier_positions
    from eagle3.data.record import verifier_fingerprint
    from eagle3.data.regenerate import eos_ids
    from eagle3.serve.export import read_verifier
    from eagle3.verifier.shape import read_verifier_config

    text = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
            "intermediate_size": 128, "vocab_size": 100, "max_position_embeddings": 256, "eos_token_id": 7,
            "rms_norm_eps": 1e-5}
    verifier = tmp_path / "wrapped"
    verifier.mkdir()
    (verifier / "config.json").write_text(json.dumps({"model_type": "kimi_k25", "text_config": text,
                                                      "vision_config": {"hidden_size": 1152}}))
    assert read_verifier_config(verifier) == text and read_verifier(verifier) == text
    fingerprint = verifier_fingerprint(verifier)
    assert (fingerprint["hidden_size"], fingerprint["num_hidden_layers"], fingerprint["model_type"]) == (64, 4,
                                                                                                         "kimi_k25")
    assert verifier_positions(verifier) == 256 and eos_ids(verifier) == [7]


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


# --- the plan: CPU runs are checked against the host's memory; plan=true's exit status ------------------------

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
    from eagle3.plan.memory import NO_FIT_STATUS, format_plan
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


# --- eval.speedup and the acceptance probe: options out of range ----------------------------------------------

@pytest.mark.parametrize("costs", [["--baseline-ms", "inf", "--verify-ms", "30"],
                                   ["--baseline-ms", "12", "--verify-ms", "inf"],
                                   ["--baseline-ms", "12", "--verify-ms", "30", "--draft-ms", "inf"]])
def test_speedup_refuses_infinite_step_costs(costs, capsys):
    from eagle3.eval.speedup import main

    with pytest.raises(SystemExit) as refused:
        main(["--accept-rates", "0.5", "0.3", *costs])
    assert "must be positive, finite milliseconds" in str(refused.value)
    assert "infx" not in capsys.readouterr().out
    main(["--accept-rates", "0.5", "0.3", "--baseline-ms", "12", "--verify-ms", "30"])  # finite: predicted
    assert "x" in capsys.readouterr().out


def test_a_k_and_max_new_tokens_beyond_the_verifiers_positions_are_one_message():
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3.eval.measure import AcceptanceProbe

    verifier = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    with pytest.raises(ConfigError, match=r"k=1000 draft tokens and max_new_tokens=4 leave no room for a prompt .*"
                                          r"max_position_embeddings \(64\)") as refused:
        AcceptanceProbe(verifier, [[1, 2]], k=1000, max_new_tokens=4)
    assert "-" not in str(refused.value).split("(64)")[0].split("prompt")[-1]  # no negative token count
    AcceptanceProbe(verifier, [[1, 2]], k=3, max_new_tokens=4)  # room left: accepted


# --- data.path that is neither a regular file nor a dir -------------------------------------------------------

def test_a_fifo_or_a_device_as_data_path_is_named_for_what_it_is(tmp_path):
    fifo = tmp_path / "rows.fifo"
    os.mkfifo(fifo)
    for option, path, says in (("online", fifo, "is a FIFO (named pipe), not a regular file or a dataset dir"),
                               ("online", Path("/dev/zero"), "is a character device, not a regular file"),
                               ("offline", fifo, "is a FIFO (named pipe), not a directory"),
                               ("offline", Path("/dev/zero"), "is a character device, not a directory")):
        with pytest.raises(ConfigError, match="data.path") as refused:
            tiny_run_config([f"data={option}", f"data.path={path}"])
        assert f"{path} {says}" in str(refused.value) and "does not exist" not in str(refused.value)
    with pytest.raises(ConfigError, match=r"data\.path: .*missing does not exist"):
        tiny_run_config(["data=online", f"data.path={tmp_path / 'missing'}"])
    with pytest.raises(ConfigError, match=r"eval\.accept\.prompts: .* is a FIFO \(named pipe\), not a regular file"):
        tiny_run_config(["eval.accept.enabled=true", f"eval.accept.prompts={fifo}"])


# --- a fresh run dir holding symlinks that lead outside it or nowhere -----------------------------------------

def test_a_run_dir_with_symlinks_leading_out_is_refused_and_nothing_is_written_through(tmp_path):
    from eagle3.rundir.files import RunDir

    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    (run_dir / "wandb" / "run-1").mkdir(parents=True)
    (run_dir / "wandb" / "latest-run").symlink_to("run-1")  # inside the run dir (as wandb links): allowed
    RunDir(run_dir).refuse_to_overwrite()
    (run_dir / ".hydra").mkdir()
    for name in ("resolved_config.yaml", "summary.json", ".hydra/config.yaml"):
        (run_dir / name).symlink_to(outside / Path(name).name)  # dangling, and leading out
    with pytest.raises(ConfigError, match="symlinks that lead outside it or nowhere") as refused:
        RunDir(run_dir).refuse_to_overwrite()
    message = str(refused.value)
    assert "summary.json -> " in message and ".hydra/config.yaml -> " in message and "latest-run" not in message
    (run_dir / ".lock").symlink_to(outside / ".lock")
    with pytest.raises(UserError, match=r"\.lock is a symlink"):
        RunDir(run_dir).hold()
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_launch_in_a_dir_of_dangling_symlinks_writes_nothing_outside_it(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    for name in (".lock", "launch.log", "resolved_config.yaml", "metrics.jsonl", "summary.json", "failure.json"):
        (run_dir / name).symlink_to(outside / name)
    proc = launch([f"hydra.run.dir={run_dir}", "optim.max_steps=1"], tmp_path / "cache")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "symlinks that lead outside it or nowhere" in proc.stderr
    assert list(outside.iterdir()) == [] and not (run_dir / ".hydra").exists()
