"""The schemas in eagle3/config/ are where a value is declared and checked: string choices are Enums (a typo fails
at composition, with Hydra's own message), `auto` is resolved once (eagle3.device.choice), each range is checked in one
schema and the CLIs take their options from it, and the option files in conf/ state only what differs from it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from eagle3.config import plain_config, run_config, validate
from eagle3.errors import ConfigError
from factories import checked_config, compose_cfg, tiny_run_config


def typed(overrides: list[str] | None = None):
    return validate(OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True))


@pytest.mark.parametrize("override,key,choices", [
    ("model.draft.attn_impl=flash", "model.draft.attn_impl", "[auto, sdpa, eager, simple_flex_attention]"),
    ("model.draft.loss=kl", "model.draft.loss", "kl_div"),
    ("distributed.backend=mpi", "distributed.backend", "[auto, nccl, gloo]"),
    ("device=tpu", "device", "[auto, cpu, cuda]"),
])
def test_a_mistyped_choice_fails_at_composition_naming_the_choices(override, key, choices):
    with pytest.raises(ConfigCompositionException) as e:
        compose_cfg([override])
    cause = str(e.value.__cause__)
    assert "Invalid value" in cause and choices in cause and f"full_key: {key}" in cause, cause


def test_choices_compare_as_strings_and_are_written_as_their_names(tmp_path):
    cfg = typed(["model.draft.attn_impl=eager", "distributed.backend=gloo", "device=cpu"])
    assert cfg.model.draft.attn_impl == "eager" and cfg.distributed.backend == "gloo" and cfg.device == "cpu"
    assert cfg.model.draft.loss == "kl_div"
    plain = {**plain_config(cfg), "run": {"dir": str(tmp_path), "name": "r", "group": "g"}}
    assert plain["model"]["draft"]["attn_impl"] == "eager" and plain["device"] == "cpu"
    text = yaml.safe_dump(plain)  # resolved_config.yaml: plain strings, no python tags
    assert "!!python" not in text
    again = run_config(yaml.safe_load(text))  # an old run dir's file (strings) reads through the same schemas
    assert again.model.draft.attn_impl == "eager" and again.distributed.backend == "gloo"


def test_the_runtime_resolves_auto_on_a_cpu_machine(monkeypatch):
    import torch

    from eagle3.device.choice import Runtime, resolve_runtime, runtime_of

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime_of(typed()) == Runtime("cpu", "gloo", "sdpa", "float32")
    assert resolve_runtime("cpu", "auto", "eager") == Runtime("cpu", "gloo", "eager", "float32")
    with pytest.raises(ConfigError, match=r"^device=cuda needs a CUDA GPU, and torch sees none"):
        resolve_runtime("cuda")
    with pytest.raises(ConfigError, match=r"^distributed.backend=nccl needs a CUDA GPU.*backend=auto \(gloo on CPU\)"):
        resolve_runtime("auto", "nccl")


def test_the_runtime_resolves_auto_on_a_gpu_machine(monkeypatch):
    import torch

    from eagle3.device.choice import Runtime, resolve_runtime

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    cuda = resolve_runtime("auto")
    assert cuda == Runtime("cuda", "nccl", "simple_flex_attention", "bfloat16")
    assert (cuda.loss_impl, cuda.device(1), cuda.dtype()) == ("fused", torch.device("cuda", 1), torch.bfloat16)
    assert resolve_runtime("cpu").device_type == "cpu"  # asked for the CPU: the GPU is not used
    assert resolve_runtime("auto", "gloo").backend == "gloo"
    with pytest.raises(ConfigError, match=r"nproc_per_node=4 starts one rank per GPU, and this machine has 2"):
        resolve_runtime("cuda", ranks_per_node=4)


def test_the_plan_names_the_attention_as_a_plain_string():
    from eagle3.run.plan_guard import run_plan

    plan = run_plan(typed(["model.draft.attn_impl=eager", "device=cpu", "distributed.device_memory_gb=16"]))
    assert type(plan.attn_impl) is str and plan.attn_impl == "eager"
    assert run_plan(typed(["device=cpu", "distributed.device_memory_gb=16"])).attn_impl == "sdpa"


def config_message(override: str) -> str:
    with pytest.raises(ConfigError) as e:
        typed([override])
    return str(e.value)


@pytest.mark.parametrize("argv,override,flag", [
    (["--temperature", "-1"], "eval.accept.temperature=-1", "--temperature"),
    (["--k", "0"], "eval.accept.k=0", "--k"),
    (["--num-prompts", "0"], "eval.accept.num_prompts=0", "--num-prompts"),
    (["--max-new-tokens", "1"], "eval.accept.max_new_tokens=1", "--max-new-tokens"),
])
def test_eval_accept_refuses_an_option_with_its_schema_message(argv, override, flag, tmp_path):
    from eagle3.cli.accept import main

    key = override.split("=")[0]
    with pytest.raises(SystemExit) as e:
        main(["--run", str(tmp_path), *argv])  # refused before the run dir is read
    assert str(e.value.code) == "error: " + config_message(override).replace(f"{key}:", f"{flag} ({key}):")


def test_eval_accept_takes_its_defaults_and_help_from_the_schema(capsys):
    from eagle3.cli.accept import parse_args
    from eagle3.config import AcceptEvalConfig

    args, schema = parse_args([]), AcceptEvalConfig()
    assert (args.num_prompts, args.max_new_tokens, args.temperature) == (schema.num_prompts, schema.max_new_tokens,
                                                                         schema.temperature)
    assert args.k is None  # the checkpoint's ttt_steps, not eval.accept.k's default
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "sampling temperature (0: greedy; > 0: speculative sampling, seeded by `seed`) (default: 0, as " \
           "eval.accept.temperature)" in text  # the comment next to the field in eagle3/config/training.py
    assert "tokens generated per prompt (default: 32, as eval.accept.max_new_tokens)" in text


def test_data_check_refuses_a_total_seq_len_with_its_schema_message(tmp_path, capsys):
    from eagle3.cli.check import main

    with pytest.raises(SystemExit) as e:
        main([str(tmp_path), "--total-seq-len", "1"])
    expected = config_message("data.total_seq_len=1").replace("data.total_seq_len:", "--total-seq-len "
                                                                                     "(data.total_seq_len):")
    assert e.value.code == 2 and expected in capsys.readouterr().err


def test_data_prepare_takes_on_bad_sample_and_device_from_the_schemas(capsys):
    from eagle3.cli.prepare import main
    from eagle3.config import BadSamplePolicy, Device

    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--on-bad-sample {" + ",".join(p.value for p in BadSamplePolicy) + "}" in text
    assert "(default: error, as data.on_bad_sample)" in text
    assert "--device {" + ",".join(d.value for d in Device) + "}" in text


def test_bad_samples_take_the_policy_names_of_the_schema():
    from eagle3.formats.row_formats import BadSamples

    assert BadSamples("skip").policy == "skip"
    with pytest.raises(ValueError, match="'sometimes' is not a valid BadSamplePolicy"):
        BadSamples("sometimes")


@pytest.mark.slow
@pytest.mark.parametrize("argv,status", [
    (["eagle3.eval.accept", "--run", "{tmp}", "--temperature", "-1"], 1),
    (["eagle3.data.check", "{tmp}", "--total-seq-len", "1"], 2),
])
def test_a_refused_cli_option_is_one_line_on_the_console(argv, status, tmp_path):
    import subprocess
    import sys

    from factories import ROOT

    argv = [a.format(tmp=tmp_path) for a in argv]
    proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == status, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert len(lines) == 1 and "Traceback" not in proc.stderr and "must be" in lines[0], proc.stderr


# conf/data is the data sources' (their own schemas); conf/hydra holds Hydra's and its plugins' options.
DELTA_GROUPS = ("distributed", "experiment", "init", "logger", "model", "optim")


def option_files(conf) -> list[tuple[str, list[str]]]:
    """Each option file in the delta groups (path relative to conf/) with the override that selects it."""
    files = [("train.yaml", [])]
    for group in DELTA_GROUPS:
        for path in sorted((conf / group).rglob("*.yaml")):
            option = path.relative_to(conf / group).with_suffix("").as_posix()
            files.append((path.relative_to(conf).as_posix(), [f"{group}={option}"]))
    return files


def leaf_keys(node: dict, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    keys = []
    for key, value in node.items():
        if isinstance(value, dict) and value:
            keys += leaf_keys(value, (*prefix, str(key)))
        else:
            keys.append((*prefix, str(key)))
    return keys


def composed(overrides: list[str]) -> dict:
    """The composition of `overrides`, unresolved (inside initialize_config_dir)."""
    from hydra import compose

    return OmegaConf.to_container(compose(config_name="train", overrides=overrides), resolve=False)


def at(plain: dict, parts: tuple[str, ...]):
    for part in parts:
        if not isinstance(plain, dict) or part not in plain:
            return "<absent>"
        plain = plain[part]
    return plain


def restated_lines(conf, rel: str, overrides: list[str]) -> list[str]:
    """The keys of conf/<rel> whose line changes nothing: the config composed without the file's own values (its
    defaults list kept) already has them."""
    path = conf / rel
    text = path.read_text()
    body = yaml.safe_load(text) or {}
    package = () if rel == "train.yaml" or "@package _global_" in text else (rel.split("/")[0],)
    keys = leaf_keys({k: v for k, v in body.items() if k != "defaults"})
    full = composed(overrides)
    header = "# @package _global_\n" if "@package _global_" in text else ""
    path.write_text(header + yaml.safe_dump({"defaults": body["defaults"]} if "defaults" in body else {}))
    try:
        parent = composed(overrides)
    finally:
        path.write_text(text)
    return [f"{rel}: {'.'.join(key)}: {at(full, package + key)!r}" for key in keys
            if at(full, package + key) == at(parent, package + key)]


@pytest.mark.slow  # about 50 compositions
def test_option_files_hold_only_deltas_from_their_schemas(tmp_path):
    import shutil

    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from eagle3.config import register_configs
    from eagle3.verifier.shape import register_resolvers
    from factories import CONF

    conf = tmp_path / "conf"
    shutil.copytree(CONF, conf)
    register_configs()
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        restated = [line for rel, overrides in option_files(conf) for line in restated_lines(conf, rel, overrides)]
    assert not restated, "lines equal to what the schema (or the option they extend) already says; drop them " \
                         "and move their comments onto the schema's field in eagle3/config/:\n" + "\n".join(restated)


def test_a_signal_raises_in_the_block_and_the_handler_before_it_is_back():
    import os
    import signal

    from eagle3.errors import StoppedBeforeTraining
    from eagle3.signal_scope import raising_on

    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(StoppedBeforeTraining) as e, raising_on((signal.SIGUSR1,), StoppedBeforeTraining):
        os.kill(os.getpid(), signal.SIGUSR1)
    assert e.value.signum == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is before


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


def test_a_mask_token_for_a_draft_without_masked_slots_is_refused():
    """model.draft.mask_token_id means something to P-EAGLE and DFlash only; with the default kind=eagle3 it did
    nothing."""
    with pytest.raises(ConfigError, match=r"^model.draft.mask_token_id: .* model.draft.kind=eagle3 has none: drop it, "
                                          r"or set model.draft.kind=peagle or dflash$"):
        checked_config(["model.draft.mask_token_id=5"])
    assert checked_config(["model.draft.kind=peagle", "model.draft.mask_token_id=5"]).model.draft.mask_token_id == 5


def test_an_infinite_accept_temperature_is_refused_in_the_run_and_the_cli():
    """T=inf divides every logit to 0: a uniform draw, whatever the verifier and the draft say."""
    from eagle3.cli.accept import main as accept_main

    with pytest.raises(ConfigError, match=r"^eval.accept.temperature: must be >= 0 and finite, got inf$"):
        checked_config(["eval.accept.temperature=inf"])
    with pytest.raises(SystemExit, match=r"^error: --temperature \(eval.accept.temperature\): must be >= 0 and "
                                         r"finite, got inf$"):
        accept_main(["--temperature", "inf"])


@pytest.mark.parametrize("source", ["tiny", "online"])
def test_an_infinite_synth_temperature_is_refused(source):
    """Responses drawn at T=inf are uniform noise, not the verifier's: no row would be like its output."""
    with pytest.raises(ConfigError, match=r"^data.synth.temperature: must be > 0 and finite .*, got inf$"):
        checked_config([f"data={source}", "data.synth.temperature=inf"])
