"""End to end on the tiny default: the run-dir contract, learning, and checkpoints speculators loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from commands import launch
from factories import SMALL_DATA, read_rows


def test_run_dir_contract(trained_run):
    for name in ["resolved_config.yaml", "metrics.jsonl", "summary.json", "init_report.json"]:
        assert (trained_run / name).is_file(), name
    for which in ["last", "best"]:
        assert (trained_run / "checkpoints" / which / "config.json").is_file()
        assert (trained_run / "checkpoints" / which / "model.safetensors").is_file()

    text = (trained_run / "resolved_config.yaml").read_text()
    assert "${" not in text
    resolved = yaml.safe_load(text)
    assert resolved["run"]["choices"]["model"] == "tiny" and resolved["run"]["choices"]["init"] == "scratch"
    assert resolved["optim"]["epochs"] == 2

    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["steps"] > 0 and summary["tokens_per_s"] > 0
    # Where the run's time went: every phase there, none negative, and the timed ones (all but "other", what none
    # covers) most of the job's wall time; the end-of-run table says the same.
    phases, wall = summary["phases_s"], summary["wall_s"]
    assert list(phases) == ["start-up", "data build", "val passes", "training steps", "saves", "other"]
    assert all(v >= 0 for v in phases.values()) and sum(phases.values()) == pytest.approx(wall, rel=0.01, abs=0.01)
    assert phases["training steps"] > 0 and phases["val passes"] > 0 and phases["saves"] > 0
    assert phases["other"] < 0.5 * wall
    # The inputs the run read, as absolute paths that hold what they are: a dataset and a Hugging Face model dir.
    for key, entry in [("data_dir", "hidden_states"), ("verifier_dir", "config.json")]:
        path = Path(summary[key])
        assert path.is_absolute() and (path / entry).exists(), (key, path)


def test_metrics_rows(trained_run):
    rows = read_rows(trained_run)
    first = rows[0]
    assert first["step"] == 0 and first["split"] == "val"
    train_rows = [r for r in rows if r["split"] == "train"]
    val_rows = [r for r in rows if r["split"] == "val"]
    assert train_rows and all("loss" in r and "lr" in r and "grad_norm" in r for r in train_rows)
    assert len(val_rows) == 3  # step 0 + one per epoch
    for row in val_rows:
        for k in range(3):
            assert {f"loss_{k}", f"full_acc_{k}", f"cond_acc_{k}"} <= row.keys()
        assert row["tau_sim"] == pytest.approx(1 + sum(row[f"full_acc_{k}"] for k in range(3)))
    steps = [r["step"] for r in rows]
    assert steps == sorted(steps)


def test_it_learns(trained_run):
    summary = json.loads((trained_run / "summary.json").read_text())
    assert summary["final"]["loss"] < 0.9 * summary["step0"]["loss"]
    assert summary["best"]["tau_sim"] > summary["step0"]["tau_sim"] + 0.05
    assert summary["best"]["tau_sim"] == max(r["tau_sim"] for r in read_rows(trained_run) if r["split"] == "val")


def test_best_checkpoint_loads_with_speculators_and_reproduces_val_loss(trained_run):
    from speculators.losses import resolve_loss_config
    from speculators.models.eagle3 import Eagle3DraftModel

    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.init.checkpoint import load_draft
    from eagle3.train.validation import run_validation

    cfg = yaml.safe_load((trained_run / "resolved_config.yaml").read_text())
    summary = json.loads((trained_run / "summary.json").read_text())
    draft = cfg["model"]["draft"]
    model = load_draft(trained_run / "checkpoints" / "best", attn_impl="sdpa")
    assert isinstance(model, Eagle3DraftModel)
    spec = LoaderSpec(cfg["data"]["total_seq_len"], draft["hidden_size"], len(draft["aux_layer_ids"]),
                      cfg["data"]["train_ratio"], cfg["seed"])
    _, val_loader = build_loaders(summary["data_dir"], spec)
    kwargs = {"ttt_steps": draft["ttt_steps"], "ttt_step_loss_decay": draft["ttt_step_loss_decay"],
              "loss_config": resolve_loss_config(draft["loss"], "eager")}
    from contextlib import nullcontext
    metrics = run_validation(model, val_loader, torch.device("cpu"), nullcontext(), kwargs)
    assert metrics["loss"] == pytest.approx(summary["best"]["loss"], rel=1e-4)
    assert metrics["tau_sim"] == pytest.approx(summary["best"]["tau_sim"], rel=1e-4)


def test_wandb_offline_run_is_written(trained_run):
    runs = list((trained_run / "wandb").glob("offline-run-*"))
    assert len(runs) == 1


def test_existing_run_dir_is_refused_and_kept(trained_run, cache_dir):
    before = (trained_run / "metrics.jsonl").read_text()
    mtime = (trained_run / "checkpoints" / "best" / "model.safetensors").stat().st_mtime
    proc = launch([f"hydra.run.dir={trained_run}", *SMALL_DATA], cache_dir, timeout=120)
    assert proc.returncode != 0 and "already holds a run" in proc.stderr
    assert (trained_run / "metrics.jsonl").read_text() == before
    assert (trained_run / "checkpoints" / "best" / "model.safetensors").stat().st_mtime == mtime


@pytest.mark.slow
def test_max_steps_zero_is_the_probe_alone(cache_dir, tmp_path):
    run_dir = tmp_path / "probe"
    proc = launch([f"hydra.run.dir={run_dir}", "optim.max_steps=0", "logger.mode=disabled", *SMALL_DATA], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rows(run_dir)
    assert [(r["step"], r["split"]) for r in rows] == [(0, "val")]
    assert (run_dir / "checkpoints" / "last" / "model.safetensors").is_file()
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 0
