"""Environment failures and user input that used to end in a traceback: a full disk while data is written, wandb
online without an account or a network, and files a command reads that are not what it expects. Each is one
message and a non-zero exit, and nothing half-written is left."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from safetensors import SafetensorError
from test_data import SYNTH, TINY
from test_prepare import AUX, id_rows, verifier, write_jsonl  # noqa: F401  (fixtures)

from conftest import launch
from eagle3.config import LoggerConfig, LoggerMode
from eagle3.data.synthetic import synthetic_dataset_dir
from eagle3.data.verifier import tiny_verifier_dir
from eagle3.errors import ConfigError, DataError


def disk_full_after(files: int, monkeypatch) -> None:
    """safetensors' save_file as on a disk that fills up after `files` files: part of the next file is written,
    then safetensors' own error for ENOSPC."""
    import safetensors.torch

    real, written = safetensors.torch.save_file, []

    def save_file(tensors, filename, metadata=None):
        if len(written) >= files:
            Path(filename).write_bytes(b"\0" * 100)
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        written.append(filename)
        return real(tensors, filename, metadata)

    monkeypatch.setattr(safetensors.torch, "save_file", save_file)


def disk_free(free: int, monkeypatch) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10 * 2**30, 10 * 2**30 - free, free))


def test_a_full_disk_while_caching_the_synthetic_data_is_one_error_and_leaves_no_entry(tmp_path, monkeypatch):
    verifier_dir = tiny_verifier_dir(TINY, str(tmp_path))
    disk_full_after(2, monkeypatch)
    with pytest.raises(DataError, match="no space left .* synthetic dataset; nothing half-built is kept.*cache_dir"):
        synthetic_dataset_dir(verifier_dir, SYNTH, [1, 2, 3], str(tmp_path))
    assert list((tmp_path / "datasets").iterdir()) == []


def test_the_cache_is_refused_when_its_disk_cannot_hold_the_hidden_states(tmp_path, monkeypatch):
    verifier_dir = tiny_verifier_dir(TINY, str(tmp_path))
    disk_free(4096, monkeypatch)
    with pytest.raises(ConfigError, match="GiB free, but the hidden states of these rows need .*cache_dir"):
        synthetic_dataset_dir(verifier_dir, SYNTH, [1, 2, 3], str(tmp_path))
    assert list((tmp_path / "datasets").iterdir()) == []


def prepare_main(verifier_dir: Path, data: Path, out: Path) -> int:
    from eagle3.data.prepare import main

    return main(["--model", str(verifier_dir), "--data", str(data), "--out", str(out), "--aux-layer-ids",
                 *map(str, AUX), "--batch-tokens", "256"])


def test_prepare_on_a_full_disk_keeps_whole_files_and_resumes(verifier, id_rows, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, out = write_jsonl(tmp_path / "rows.jsonl", id_rows), tmp_path / "ds"
    with monkeypatch.context() as patch:
        disk_full_after(3, patch)
        assert prepare_main(verifier, data, out) == 1
    err = capsys.readouterr().err
    assert "error: no space left on the disk of" in err and "resumes" in err and "Traceback" not in err, err
    hidden = [p.name for p in (out / "hidden_states").iterdir()]
    assert len(hidden) == 3 and all(n.startswith("hs_") for n in hidden), hidden  # no half file beside them
    assert prepare_main(verifier, data, out) == 0
    assert len(list((out / "hidden_states").glob("hs_*.safetensors"))) == len(id_rows)


def test_prepare_is_refused_when_the_disk_cannot_hold_it(verifier, id_rows, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, out = write_jsonl(tmp_path / "rows.jsonl", id_rows), tmp_path / "ds"
    disk_free(4096, monkeypatch)
    assert prepare_main(verifier, data, out) == 1
    assert "GiB free, but the hidden states of these rows need" in capsys.readouterr().err
    assert not out.exists()


def test_wandb_online_needs_a_key_found_without_the_network(tmp_path, monkeypatch):
    from eagle3.track import check_wandb, unreachable

    monkeypatch.setenv("WANDB_API_KEY", "")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NETRC", str(tmp_path / "netrc"))
    with pytest.raises(ConfigError, match="logger.mode=online: no wandb API key.*wandb login.*logger.mode=offline"):
        check_wandb(LoggerConfig(mode=LoggerMode.online))
    check_wandb(LoggerConfig(mode=LoggerMode.offline))  # offline needs neither
    assert unreachable("http://127.0.0.1:1") is not None  # a closed port: refused at once


@pytest.mark.slow
def test_wandb_online_without_a_key_or_a_network_stops_before_any_data_is_built(tmp_path):
    cache = tmp_path / "cache"
    no_key = launch(["logger.mode=online", f"hydra.run.dir={tmp_path / 'run'}"], cache, timeout=300,
                    WANDB_API_KEY="", HOME=str(tmp_path), NETRC=str(tmp_path / "netrc"))
    unreachable = launch(["logger.mode=online", f"hydra.run.dir={tmp_path / 'run2'}"], cache, timeout=300,
                         WANDB_API_KEY="0" * 40, WANDB_BASE_URL="http://127.0.0.1:1", HOME=str(tmp_path))
    for proc, message in ((no_key, "no wandb API key"), (unreachable, "cannot be reached")):
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (cache / "datasets").exists()  # refused before the data build
