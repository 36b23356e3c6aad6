"""Bad values caught by validation before anything is built: one message naming the key, a non-zero exit, no
dataset synthesized and no verifier built (the cache stays empty)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from commands import launch
from eagle3.config import MIN_SEQ_LEN, validate
from eagle3.console import hydra_override
from eagle3.errors import ConfigError
from factories import compose_cfg, verifier_config_dir


def checked(overrides: list[str]):
    """The composed config typed and checked, its verifier dir too, as a new job is before its plan."""
    from eagle3.verifier.shape import check_verifier_dir

    plain = OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True)
    cfg = validate(plain)
    check_verifier_dir(cfg.model)
    return cfg


@pytest.mark.parametrize("overrides,match", [
    (["model.draft.aux_layer_ids=[1,1,3]"], r"model.draft.aux_layer_ids: \[1, 1, 3\] names a layer twice"),
    # The suggestion itself must be valid for a shallow verifier (it used to say [2, 2, 1]).
    (["model.draft.aux_layer_ids=[1,2,4]"], r"beyond the verifier's 4 decoder layers.*here \[1, 2\]$"),
    (["model.draft.aux_layer_ids=[-1,2,3]"], r"model.draft.aux_layer_ids"),
    (["model.draft.aux_layer_ids=[]"], r"at least one"),
    (["data.total_seq_len=1"], rf"data.total_seq_len: must be at least {MIN_SEQ_LEN}, got 1"),
    (["seed=-1"], r"seed: must be in \[0, 2\*\*63\), got -1"),
    (["data.synth.num_samples=0"], r"data.synth.num_samples: must be >= 1, got 0"),
    (["data.synth.temperature=0"], r"data.synth.temperature: must be > 0"),
    (["device=cpu", "distributed.backend=nccl"], r"distributed.backend: nccl runs on CUDA GPUs only"),
])
def test_bad_values_are_refused_by_the_typed_checks(overrides, match):
    with pytest.raises(ConfigError, match=match):
        checked(overrides)


def test_the_shipped_configs_pass():
    checked([])
    checked(["data.total_seq_len=2", "seed=0", "model.draft.aux_layer_ids=[0,3]"])


def test_aux_ids_are_checked_against_a_path_verifiers_depth(tmp_path):
    verifier = verifier_config_dir(tmp_path / "verifier", num_hidden_layers=32, hidden_size=128)
    base = ["model.verifier.tiny=null", f"model.verifier.path={verifier}", "model.draft.hidden_size=128",
            "model.draft.vocab_size=1024"]
    checked([*base, "model.draft.aux_layer_ids=[2,16,29]"])
    with pytest.raises(ConfigError, match=r"\[2, 16, 32\] goes beyond the verifier's 32 decoder layers.*\[2, 16, 29\]"):
        checked([*base, "model.draft.aux_layer_ids=[2,16,32]"])


def assert_refused_before_building(proc, cache, key: str) -> None:
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert key in proc.stderr, proc.stderr[-3000:]
    assert not cache.exists() or not any(cache.iterdir()), "something was built before the refusal"


@pytest.mark.slow  # runs launch.py (refused in the first seconds)
@pytest.mark.parametrize("overrides,key", [
    (["model.draft.aux_layer_ids=[1,1,3]"], "model.draft.aux_layer_ids"),
    (["model.draft.aux_layer_ids=[1,2,9]"], "model.draft.aux_layer_ids"),
    (["data.total_seq_len=1"], "data.total_seq_len"),
    (["seed=-1"], "seed"),
    (["distributed=ddp", "distributed.backend=nccl", "optim.max_steps=1"], "distributed.backend=nccl"),
    (["device=cuda"], "device=cuda"),
])
def test_launch_refuses_them_with_one_message(overrides, key, tmp_path):
    if key in ("device=cuda", "distributed.backend=nccl") and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    cache = tmp_path / "cache"
    proc = launch([f"hydra.run.dir={tmp_path / 'run'}", *overrides], cache, timeout=180)
    assert_refused_before_building(proc, cache, key)


@pytest.mark.slow  # runs launch.py (refused before Hydra creates anything)
@pytest.mark.parametrize("where", ["file", "inside_file", "read_only", "inside_read_only"])
def test_an_unusable_run_dir_is_refused_with_one_message(where, tmp_path):
    a_file = tmp_path / "a_file"
    a_file.write_text("not a dir")
    # /proc refuses new files even to root, which ignores permission bits.
    run_dir = {"file": a_file, "inside_file": a_file / "run", "read_only": "/proc",
               "inside_read_only": "/proc/eagle3/run"}[where]
    cache = tmp_path / "cache"
    proc = launch([hydra_override("hydra.run.dir", run_dir)], cache, timeout=180)
    assert_refused_before_building(proc, cache, "hydra.run.dir")
    assert a_file.read_text() == "not a dir"
