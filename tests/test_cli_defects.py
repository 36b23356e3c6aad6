"""Environment failures and user input that used to end in a traceback: a full disk while data is written, wandb
online without an account or a network, and files a command reads that are not what it expects. Each is one
message and a non-zero exit, and nothing half-written is left."""

from __future__ import annotations

import json
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from safetensors import SafetensorError
from test_data import SYNTH, TINY
from test_prepare import AUX, id_rows, verifier, write_jsonl  # noqa: F401  (fixtures)
from test_rundir import summary_json

from conftest import launch
from eagle3.config import LoggerConfig, LoggerMode
from eagle3.data.synthetic import synthetic_dataset_dir
from eagle3.errors import ConfigError, DataError
from eagle3.verifier.tiny import tiny_verifier_dir


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
    from eagle3.train.track import check_wandb, unreachable

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


# --- user input that a command reads --------------------------------------------------------------------------


def verifier_config_dir(path: Path, **config) -> Path:
    path.mkdir()
    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 8, "num_attention_heads": 4,
            "num_key_value_heads": 4, "intermediate_size": 128, "vocab_size": 256, "max_position_embeddings": 128}
    (path / "config.json").write_text(json.dumps({k: v for k, v in {**base, **config}.items() if v is not None}))
    return path


@pytest.mark.slow
def test_cfg_job_resolve_with_model_auto_says_what_the_verifier_config_lacks(cache_dir, tmp_path):
    for config, message in (({"hidden_size": None}, "config.json has no hidden_size"),
                            ({"num_hidden_layers": 2}, "the verifier has 2 layers, too few")):
        verifier_dir = verifier_config_dir(tmp_path / message.split()[-1].replace(",", ""), **config)
        proc = launch(["model=auto", f"model.verifier.path={verifier_dir}", "--cfg", "job", "--resolve"], cache_dir,
                      timeout=120)
        assert proc.returncode == 1 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_prompts_file_that_is_not_utf8_is_one_error(tmp_path):
    from conftest import compose_cfg
    from eagle3.config import validate
    from eagle3.eval.prompts import read_prompts_file

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"input_ids": [1, 2, 3]}\n{"input_ids": [4, 5]}  \xff\xfe\n')
    with pytest.raises(DataError, match=r"prompts.jsonl:2: not UTF-8 text"):
        read_prompts_file(prompts, tmp_path)  # as eval.accept --prompts and the val passes read it
    prompts.write_bytes(b"\xff\xfe" + "{}".encode("utf-16-le"))  # a UTF-16 file: refused before the run starts
    plain = OmegaConf.to_container(compose_cfg(["eval.accept.enabled=true", f"eval.accept.prompts={prompts}"]),
                                   resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError, match="^eval.accept.prompts: .*not UTF-8"):
        validate(plain)


def test_speedup_refuses_a_report_with_a_text_temperature_and_a_json_path_under_a_file(tmp_path):
    from eagle3.eval.speedup import main

    report = tmp_path / "accept_k2.json"
    report.write_text(json.dumps({"k": 2, "accept_rate": [0.8, 0.6], "temperature": "greedy"}))
    costs = ["--baseline-ms", "10", "--verify-ms", "12"]
    with pytest.raises(SystemExit, match="^error: --accept: .*temperature 'greedy', not a number"):
        main(["--accept", str(report), *costs])
    report.write_text(json.dumps({"k": 2, "accept_rate": [0.8, 0.6], "temperature": 0.0}))
    with pytest.raises(SystemExit, match=r"^error: --json: .*accept_k2.json is an existing file, not a directory"):
        main(["--accept", str(report), *costs, "--json", str(report / "out.json")])


def test_compare_shows_the_readable_runs_and_names_a_cut_file(tmp_path, capsys):
    from eagle3.sweep.compare import main

    row = {"step": 0, "split": "val", "loss": 2.0, "tau_sim": 1.0}
    for n, lr in enumerate((0.001, 0.002, 0.003)):
        run = tmp_path / f"{n}_optim.lr={lr}"
        run.mkdir()
        (run / "resolved_config.yaml").write_text(f"optim:\n  lr: {lr}\n")
        (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
        (run / "summary.json").write_text(summary_json(row, row, row))
    with open(tmp_path / "1_optim.lr=0.002" / "metrics.jsonl", "a") as f:
        f.write('{"step": 4, "split": "tr')  # the last line, cut by a kill: a warning, the run is still whole
    assert main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert [line.split()[:2] for line in out.splitlines()[-3:]] == [["#0", "completed"], ["#1", "completed"],
                                                                    ["#2", "completed"]]
    assert "1_optim.lr=0.002/metrics.jsonl line 2 is not a whole metrics row" in err
    (tmp_path / "2_optim.lr=0.003" / "summary.json").write_text('{"step0": {"step": 0, "split": "val", "lo')
    assert main([str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert [line.split()[:2] for line in out.splitlines()[-3:]] == [["#0", "completed"], ["#1", "completed"],
                                                                    ["#2", "unreadable"]]
    assert "error: run #2: " in err and "2_optim.lr=0.003/summary.json: cannot be read" in err


def test_summary_json_is_whole_or_absent_when_its_write_fails(tmp_path, monkeypatch):
    import errno

    from eagle3.rundir.progress import Progress, RunSummary
    from eagle3.train.track import Tracker

    row = {"step": 4, "split": "val", "epoch": 0, "loss": 2.5, "tau_sim": 1.25}
    summary = RunSummary.of(Progress(step=4, step0=row, best=row, final=row), Path("/v"), Path("/d"), "cpu", 1)

    from eagle3 import safe_write

    real = safe_write.open_write

    class HalfThenFull:  # the disk fills up halfway through the file
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            self.file.write(text[: len(text) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

    with Tracker(tmp_path, LoggerConfig(mode=LoggerMode.disabled)) as tracker:
        monkeypatch.setattr(safe_write, "open_write", lambda *a, **k: HalfThenFull(real(*a, **k)))
        with pytest.raises(OSError):
            tracker.finish(summary)
    assert not (tmp_path / "summary.json").exists()


def test_prepare_removes_half_written_rows_on_a_full_disk(verifier, id_rows, tmp_path, monkeypatch, capsys):  # noqa: F811
    import errno

    import eagle3.data.prepare as prepare

    def save_rows(rows, out_dir):  # the Arrow file is cut short when the disk fills up
        (out_dir / "data-00000-of-00001.arrow").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    data, out = write_jsonl(tmp_path / "rows.jsonl", id_rows), tmp_path / "ds"
    monkeypatch.setattr(prepare, "save_rows", save_rows)
    assert prepare_main(verifier, data, out) == 1
    assert "error: no space left on the disk of" in capsys.readouterr().err
    assert not list(out.glob("*.arrow"))
