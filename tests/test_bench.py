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


def curve_dir(root):
    """A learning-curve dir as docs/learning_curve.sh leaves it after training: one finished run whose
    checkpoints/last has trained 1,000 tokens."""
    import torch

    run = root / "seed_0"
    (run / "checkpoints" / "last").mkdir(parents=True)
    (run / "summary.json").write_text("{}")
    (run / "resolved_config.yaml").write_text("seed: 0\n")
    (run / "checkpoints" / "last" / "model.safetensors").write_bytes(b"weights")
    torch.save({"progress": {"tokens": 1000, "step": 2}}, run / "checkpoints" / "last" / "trainer_state.pt")
    return run


def test_learning_curve_snapshots_and_points_are_copied_whole_and_never_through_a_link(tmp_path):
    """bench/learning_curve.py writes through eagle3.safe_write: a symlink at RUN/snapshots, at DIR/points or at
    the CSV is refused with its name, and nothing lands where it points."""
    root, outside = tmp_path / "curve", tmp_path / "outside"
    outside.mkdir()
    run = curve_dir(root)
    (run / "snapshots").symlink_to(outside)
    proc = run_in_process(["python", "bench/learning_curve.py", "snapshot", str(run), "--name", "ck_final"])
    assert proc.returncode != 0 and f"{run / 'snapshots'} is a symlink" in proc.stderr
    (run / "snapshots").unlink()
    for _ in range(2):  # the second call keeps the first copy: a snapshot is never overwritten
        proc = run_in_process(["python", "bench/learning_curve.py", "snapshot", str(run), "--name", "ck_final"])
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (run / "snapshots").iterdir()) == ["ck_final"]
    assert (run / "snapshots" / "ck_final" / "model.safetensors").read_bytes() == b"weights"

    (root / "points").symlink_to(outside)
    proc = run_in_process(["python", "bench/learning_curve.py", "points", str(root), "--budgets", "1000"])
    assert proc.returncode != 0 and f"{root / 'points'} is a symlink" in proc.stderr
    (root / "points").unlink()
    proc = run_in_process(["python", "bench/learning_curve.py", "points", str(root), "--budgets", "1000"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    point = root / "points" / "seed_0_1000"
    assert sorted(p.name for p in (root / "points").iterdir()) == ["seed_0_1000"]
    assert sorted(p.name for p in (point / "checkpoints" / "best").iterdir()) == ["model.safetensors"]
    assert json.loads((point / "point.json").read_text())["snapshot"] == "ck_final"

    (point / "serve_vllm_k3_t0.json").write_text(json.dumps({"k": 3, "accept_len": 1.2, "accept_len_se": 0.01,
                                                             "plain_tokens_per_s": 20.0}))
    (outside / "curve.csv").write_text("theirs")
    (tmp_path / "curve.csv").symlink_to(outside / "curve.csv")
    report = ["python", "bench/learning_curve.py", "report", str(root), "--csv"]
    proc = run_in_process([*report, str(tmp_path / "curve.csv")])
    assert proc.returncode != 0 and f"{tmp_path / 'curve.csv'} is a symlink" in proc.stderr
    assert (outside / "curve.csv").read_text() == "theirs"
    assert sorted(p.name for p in outside.iterdir()) == ["curve.csv"]
    proc = run_in_process([*report, str(root / "curve.csv")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [line.split(",")[:5] for line in (root / "curve.csv").read_text().splitlines()] == [
        ["kind", "seed", "step", "tokens", "k"], ["eagle3", "0", "2", "1000", "3"], ["plain", "", "", "", "0"]]
