"""Composition: every option of every group composes; bad input fails at once with one clear message."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from commands import launch
from eagle3.config import ConfigError, validate
from factories import CONF, ROOT, compose_cfg, verifier_config_dir

GROUPS = ["model", "data", "init", "optim", "distributed", "logger"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]
# Values only the user can give: they must be marked required, never defaulted.
REQUIRED = {("model", "kimi_k25"): ["model.verifier.path"], ("model", "auto"): ["model.verifier.path"],
            ("model", "llama3_8b"): ["model.verifier.path"], ("model", "qwen3_8b"): ["model.verifier.path"],
            ("data", "offline"): ["data.path"], ("data", "regenerate"): ["data.path"],
            ("init", "pretrained"): ["init.path"],
            ("distributed", "multinode"): ["distributed.node_rank", "distributed.rdzv_endpoint"]}


def user_values(tmp_path, num_layers: int = 36) -> dict:
    """Values a user gives for the REQUIRED keys, each one that validate() accepts (paths that exist); the
    verifier's depth bounds the aux layer ids."""
    data = tmp_path / "data"
    (data / "hidden_states").mkdir(parents=True)
    # model=auto and its presets read the draft's shape from the verifier's config.json
    # (a vocabulary above the presets' pinned draft vocabulary of 32000, as Llama's and Qwen's are)
    verifier = verifier_config_dir(tmp_path / "verifier", hidden_size=64, num_attention_heads=4, intermediate_size=128,
                                   vocab_size=152064, num_hidden_layers=num_layers, max_position_embeddings=128,
                                   rope_theta=10000.0, rms_norm_eps=1e-6)
    (tmp_path / "prompts.jsonl").write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n')  # data=regenerate's
    return {"model.verifier.path": str(verifier), "data.path": str(data), "init.path": str(tmp_path),
            "distributed.node_rank": 1, "distributed.rdzv_endpoint": "node0:29500"}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_validates(group, option, tmp_path):
    cfg = compose_cfg([f"{group}={option}"])
    # kimi_k25 pins aux ids [2, 30, 58] for Kimi-K2.5's 61 layers
    values = user_values(tmp_path, num_layers=61 if option == "kimi_k25" else 36)
    for key in REQUIRED.get((group, option), []):
        parent, leaf = key.rsplit(".", 1)
        assert OmegaConf.is_missing(OmegaConf.select(cfg, parent), leaf), key
        regenerate = (group, option) == ("data", "regenerate")  # a prompt set, not a dataset dir
        OmegaConf.update(cfg, key, str(tmp_path / "prompts.jsonl") if regenerate else values[key])
    # throw_on_missing: no other value is left for the user to find out about at run time; validate(): the
    # shipped values are in range and consistent (e.g. model=kimi_k25 with the tiny verifier switched off).
    validate(OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True))


def test_each_group_has_options():
    for group in GROUPS:
        assert any(g == group for g, _ in OPTIONS), group


def test_default_config_is_valid():
    resolved = OmegaConf.to_container(compose_cfg(), resolve=True, enum_to_str=True)
    validate(resolved)
    assert resolved["model"]["draft"]["hidden_size"] == resolved["model"]["verifier"]["tiny"]["hidden_size"]


@pytest.mark.parametrize("override,key", [
    ("optim.lr=-1", "optim.lr"),
    ("optim.warmup_ratio=2", "optim.warmup_ratio"),
    ("optim.epochs=0", "optim.epochs"),
    ("data.train_ratio=1.0", "data.train_ratio"),
    ("model.draft.draft_vocab_size=5000", "model.draft.draft_vocab_size"),
    ("distributed.device_memory_gb=0", "distributed.device_memory_gb"),
])
def test_validate_names_the_key(override, key):
    resolved = OmegaConf.to_container(compose_cfg([override]), resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(resolved)


TEMPERATURES = [(["data=tiny"], "data.synth.temperature"), (["data=regenerate"], "data.regenerate.temperature"),
                (["train.on_policy.enabled=true"], "train.on_policy.temperature"), ([], "eval.accept.temperature")]


@pytest.mark.parametrize("value", ["inf", "nan"])
@pytest.mark.parametrize("choices,key", TEMPERATURES, ids=[key for _, key in TEMPERATURES])
def test_every_sampling_temperature_refuses_a_non_finite_value(choices, key, value, tmp_path):
    """T=inf divides every logit to 0: tokens drawn uniformly, whatever the verifier says (regenerated and trained
    on, or rolled out and trained on); NaN samples from NaN. One check, config.require_temperature, for each key."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"input_ids": [1, 2], "loss_mask": [0, 1]}\n')
    paths = [f"data.path={prompts}"] if "data=regenerate" in choices else []
    resolved = OmegaConf.to_container(compose_cfg([*choices, *paths, f"{key}={value}"]), resolve=True,
                                      enum_to_str=True)
    with pytest.raises(ConfigError, match=rf"^{key}: must be (>= 0|> 0) and finite.*, got {value}$"):
        validate(resolved)


@pytest.mark.parametrize("override,expected", [
    ("optim.lr=abc", ["optim.lr", "abc"]),
    ("optim.lrr=1", ["optim.lrr"]),
    ("init=nope", ["init", "nope"]),
    ("optim.scheduler=step", ["optim.scheduler", "step"]),
])
def test_bad_override_fails_fast_with_one_message(override, expected, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch([override, f"hydra.run.dir={run_dir}"], tmp_path / "cache", timeout=60)
    assert proc.returncode != 0
    for word in expected:
        assert word in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) < 25, proc.stderr  # one screen
    assert not (run_dir / "checkpoints").exists()


def test_offline_data_missing_path_names_it(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["data=offline", "data.path=/missing/dataset", f"hydra.run.dir={run_dir}"], tmp_path / "cache",
                  timeout=60)
    assert proc.returncode != 0
    assert "/missing/dataset" in proc.stderr and "hidden_states" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (run_dir / "checkpoints").exists()


def test_a_max_records_beyond_what_a_reader_can_count_is_refused_with_the_config(tmp_path):
    """data.max_records=99999999999999999999999 passed the check and died in itertools.islice with a traceback, after
    the run dir was made: its range is the schema's, checked with the rest of the config, before any run dir."""
    rows, run_dir = tmp_path / "rows.jsonl", tmp_path / "run"
    rows.write_text('{"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}\n')
    proc = launch(["data=online", f"data.path={rows}", "data.max_records=99999999999999999999999",
                   f"hydra.run.dir={run_dir}"], tmp_path / "cache")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert ("error: data.max_records: must be null (every record) or at least 1 and below 2**63, got "
            "99999999999999999999999") in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not run_dir.exists() and not (tmp_path / "cache").exists()


# data=offline without data.path: tests/run/test_reliability.py test_malformed_override_is_one_message_naming_the_key
# [data=offline] (the same launch, the same and stricter assertions).


def test_cfg_job_imports_neither_torch_nor_speculators():
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "launch.py"), "--cfg", "job"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "optim:" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and "speculators" not in imported


def test_a_key_no_schema_has_is_refused_also_when_added_with_plus(tmp_path):
    """`+optim.lr_warmup=0.1` passes Hydra's composition; typing the config refuses it like any unknown key."""
    run_dir = tmp_path / "run"
    proc = launch(["+optim.lr_warmup=0.1", f"hydra.run.dir={run_dir}"], tmp_path / "cache", timeout=60)
    assert proc.returncode != 0
    assert "optim.lr_warmup" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (run_dir / "resolved_config.yaml").exists()


def test_run_config_is_typed_and_a_run_dirs_config_goes_through_the_same_schema():
    from eagle3.config import OptimConfig, RunConfig, Scheduler, ScratchInitConfig, run_config

    plain = OmegaConf.to_container(compose_cfg(), resolve=True, enum_to_str=True)
    plain["run"] = {"dir": "/r", "name": "r", "group": "r", "choices": {"optim": "tiny"}, "overrides": []}
    cfg = run_config(plain)
    assert isinstance(cfg, RunConfig) and isinstance(cfg.optim, OptimConfig) and isinstance(cfg.init, ScratchInitConfig)
    assert cfg.optim.scheduler is Scheduler.cosine and cfg.run.choices == {"optim": "tiny"}
    edited = {**plain, "optim": {**plain["optim"], "lr_warmup": 0.1}}
    with pytest.raises(ConfigError, match=r"optim\.lr_warmup"):
        run_config(edited)
    with pytest.raises(ConfigError, match=r"optim\.lr"):
        run_config({**plain, "optim": {**plain["optim"], "lr": "abc"}})
    with pytest.raises(ConfigError, match=r"init\.name"):
        run_config({**plain, "init": {"name": "nope"}})


@pytest.mark.parametrize("overrides,return_hydra_config", [
    (["model.draft.num_layers=2", "model=auto", "model.verifier.path=/v", "seed=3"], False),
    (["model.draft.num_layers=2", "model=auto", "model.verifier.path=/v", "seed=3"], True),
    (["data.path=/rows.jsonl", "data=online", "data.synth.num_samples=8", "data.synth.num_samples=9",
      "model.draft.aux_layer_ids=[0,1]", "hydra.job.name=j"], True),
    (["experiment=kimi_k25_scratch", "+optim.lr_warmup=0.1", "++eval.accept.k=2"], False),
    (["optim.lr=abc"], False), (["optim.lrr=1"], True), (["~optim.nope"], False), (["model=nope", "optim.lr=1"], False),
    (["modle=auto", "seed=1"], False), (["device=tpu"], True),
])
def test_compose_cfg_is_hydras_composition(overrides, return_hydra_config):
    """factories' compose_cfg composes a config once for many tests and applies the keys' overrides after; its
    config (its hydra node and flags with it) or its error is Hydra's compose of the whole list."""
    from hydra.errors import HydraException

    from factories import composed

    def outcome(compose):
        try:
            cfg = compose()
        except HydraException as e:
            return type(e), str(e), str(e.__cause__)
        return OmegaConf.to_container(cfg), OmegaConf.is_struct(cfg), OmegaConf.is_struct(cfg.model.draft)

    assert outcome(lambda: compose_cfg(overrides, return_hydra_config)) == \
        outcome(lambda: composed(overrides, return_hydra_config))
