"""Composition: every option of every group composes; bad input fails at once with one clear message."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import CONF, ROOT, compose_cfg, launch
from eagle3.config import ConfigError, validate

GROUPS = ["model", "data", "init", "optim", "distributed", "logger"]
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml"))]
# Values only the user can give: they must be marked required, never defaulted.
REQUIRED = {("model", "kimi_k25"): ["model.verifier.path"], ("model", "auto"): ["model.verifier.path"],
            ("model", "llama3_8b"): ["model.verifier.path"], ("model", "qwen3_8b"): ["model.verifier.path"],
            ("data", "offline"): ["data.path"],
            ("init", "pretrained"): ["init.path"],
            ("distributed", "multinode"): ["distributed.node_rank", "distributed.rdzv_endpoint"]}


@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes(group, option, tmp_path):
    cfg = compose_cfg([f"{group}={option}"])
    # model=auto and its presets read the draft's shape from the verifier's config.json
    (tmp_path / "config.json").write_text('{"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, '
                                          '"vocab_size": 500, "num_hidden_layers": 8, "max_position_embeddings": 128, '
                                          '"rope_theta": 10000.0, "rms_norm_eps": 1e-6}')
    for key in REQUIRED.get((group, option), []):
        parent, leaf = key.rsplit(".", 1)
        assert OmegaConf.is_missing(OmegaConf.select(cfg, parent), leaf), key
        OmegaConf.update(cfg, key, str(tmp_path) if "path" in key else ("h:1" if "endpoint" in key else 1))
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True, enum_to_str=True)
    assert "${" not in OmegaConf.to_yaml(resolved)


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
    ("model.draft.attn_impl=flash", "model.draft.attn_impl"),
])
def test_validate_names_the_key(override, key):
    resolved = OmegaConf.to_container(compose_cfg([override]), resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
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


def test_offline_data_without_path_says_it_is_required(tmp_path):
    proc = launch(["data=offline", f"hydra.run.dir={tmp_path / 'run'}"], tmp_path / "cache", timeout=60)
    assert proc.returncode != 0
    assert "data.path" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_cfg_job_imports_neither_torch_nor_speculators():
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "launch.py"), "--cfg", "job"], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "optim:" in proc.stdout
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "torch" not in imported and "speculators" not in imported
