"""The benchmarks run at small shapes here, so that they cannot rot between the sessions that measure with them;
each as `python bench/SCRIPT.py ...` in this process (commands.run_in_process): their numbers are not checked here,
only that they run and report."""

from __future__ import annotations

import json

import pytest

from commands import run_in_process


@pytest.mark.slow
def test_gpu_benchmark_runs_at_a_cpu_shape(tmp_path):
    out = tmp_path / "gpu.json"
    proc = run_in_process(["python", "bench/gpu.py", "--small", "--steps", "2", "--warmup", "1", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eagle3 trainer:" in proc.stdout
    result = json.loads(out.read_text())
    assert result["eagle3_tokens_per_s"] > 0 and result["shape"]["hidden"] == 64


@pytest.mark.slow
def test_loader_benchmark_runs_at_a_tiny_shape(tmp_path):
    out = tmp_path / "loader.json"
    proc = run_in_process(["python", "bench/loader.py", "--small", "--passes", "1", "--dir", str(tmp_path / "data"),
                           "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio data path / raw:" in proc.stdout
    result = json.loads(out.read_text())
    assert result["loader_tokens_per_s"] > 0 and result["raw_tokens_per_s"] > 0 and result["shape"]["hidden"] == 64


@pytest.mark.slow
def test_online_benchmark_runs_at_a_tiny_shape(tmp_path, cache_dir):
    out = tmp_path / "online.json"
    hidden_state_files = set(cache_dir.rglob("hs_*.safetensors"))
    proc = run_in_process(["python", "bench/online.py", "--small", "--steps", "2", "--reps", "1", "--warmup", "1",
                           "--json", str(out)], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ratio online / (tokens / (t_verifier_forward + t_train_step)):" in proc.stdout
    result = json.loads(out.read_text())
    assert result["online_tokens_per_s"] > 0 and result["ratio"] > 0 and 0 < result["verifier_share"] < 1
    assert result["micro_batches"] == 2 and result["total_seq_len"] == 512
    assert set(cache_dir.rglob("hs_*.safetensors")) == hidden_state_files  # online: no hidden state on disk


@pytest.mark.slow
def test_packing_benchmark_prints_both_packings_fill(tmp_path):
    out = tmp_path / "packing.json"
    proc = run_in_process(["python", "bench/packing.py", "--rows", "60", "--total-seq-len", "1024", "--replicas", "1",
                           "2", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "speculators" in proc.stdout and "eagle3" in proc.stdout
    result = json.loads(out.read_text())
    assert [(r["total_seq_len"], r["replicas"]) for r in result["results"]] == [(1024, 1), (1024, 2)]
    assert all(0 < r["speculators_fill"][0] <= 1 and 0 < r["eagle3_fill"] <= 1 for r in result["results"])
