"""A run dir works wherever it lies (moved, copied, under a path with a space), a damaged or half-saved
checkpoint is one message or is recovered, a full disk during a save keeps `last`, and a run that would train
nothing, or a resume whose config was edited, is refused."""

from __future__ import annotations

import errno
import json
import shutil
import signal
from pathlib import Path

import pytest
import torch

from commands import launch, sigterm_in_process_after_step_1
from factories import SMALL_DATA, read_rows, typed_run_config

STOPPED_ARGS = ["optim.max_steps=3", "logger.log_every=1", "logger.mode=disabled", *SMALL_DATA]


@pytest.fixture(scope="module")
def stopped_run(cache_dir, tmp_path_factory) -> Path:
    """A tiny run stopped by SIGTERM after its first step: checkpoints/last is resumable."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    proc = sigterm_in_process_after_step_1([f"hydra.run.dir={run_dir}", *STOPPED_ARGS], cache_dir)
    assert proc.returncode == 128 + signal.SIGTERM, proc.stderr[-3000:]
    return run_dir


def files_of(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def stopped_copy(stopped_run, tmp_path_factory) -> Path:
    """A copy of the stopped run, made before `moved_and_copied` moves the run away, for the tests that damage or
    edit copies of it."""
    copy = tmp_path_factory.mktemp("stopped_copy") / "run"
    shutil.copytree(stopped_run, copy)
    return copy


@pytest.fixture(scope="module")
def moved_and_copied(stopped_run, stopped_copy, cache_dir, tmp_path_factory) -> tuple[Path, Path]:
    """The stopped run copied to a path with a space and then moved away from its path, both resumed to the end."""
    base = tmp_path_factory.mktemp("elsewhere")
    copy, moved = base / "a copy of it" / "run", base / "moved"
    shutil.copytree(stopped_run, copy)
    shutil.move(str(stopped_run), moved)
    before = files_of(moved)
    resumed = launch([f"resume={copy}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert files_of(moved) == before  # resuming the copy wrote nothing into the run it was copied from
    assert not stopped_run.exists()
    resumed = launch([f"resume={moved}"], cache_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return moved, copy


@pytest.mark.slow
def test_a_moved_and_a_copied_run_dir_each_resume_as_themselves(moved_and_copied):
    for run_dir in moved_and_copied:
        summary = json.loads((run_dir / "summary.json").read_text())
        steps = [r["step"] for r in read_rows(run_dir) if r["split"] == "train"]
        assert summary["steps"] == steps[-1] > steps[0]
        assert summary["checkpoints"] == {"last": "checkpoints/last", "best": "checkpoints/best"}
        assert (run_dir / summary["checkpoints"]["best"] / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_moved_and_a_copied_run_dir_evaluate_and_compare_as_themselves(moved_and_copied, capsys):
    from eagle3.cli import compare as compare_cli
    from eagle3.eval import accept

    moved, copy = moved_and_copied
    report = accept.run(accept.AcceptRequest(run=str(copy), num_prompts=2, max_new_tokens=4))
    assert Path(report["checkpoint"]) == copy / "checkpoints" / "best"
    assert Path(report["report_path"]).parent == copy
    assert compare_cli.main([str(moved), str(copy), "--confirm", "2"]) in (0, None)
    out = capsys.readouterr()
    assert "error" not in out.err, out.err
    assert (moved / "accept_k3.json").is_file()  # measured by --confirm in the moved dir, from its own checkpoint
    assert json.loads((moved / "accept_k3.json").read_text())["checkpoint"] == str(moved / "checkpoints" / "best")
    assert "measured acceptance" in out.out and "completed" in out.out
    from eagle3.cli import speedup

    speedup.main(["--run", str(moved), "--measure", "--context", "16"])  # the moved run's draft, timed here
    assert str(moved) in capsys.readouterr().out


def test_a_missing_checkpoint_dir_is_one_message_and_never_a_hub_id(tmp_path):
    from eagle3.errors import CheckpointError
    from eagle3.init.checkpoint import load_draft

    with pytest.raises(CheckpointError, match="does not exist"):
        load_draft(tmp_path / "gone" / "checkpoints" / "last")


# --- damaged checkpoints, and a save stopped between its renames ------------------------------------------------

def damaged_copy(stopped_run_last: Path, tmp_path: Path, file: str, damage) -> Path:
    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(stopped_run_last, checkpoints / "last")
    damage(checkpoints / "last" / file)
    return checkpoints


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def garbage(file: Path) -> None:
    file.write_bytes(b"\x80\x04not a checkpoint at all" * 8)


@pytest.mark.slow
@pytest.mark.parametrize("file, damage", [("model.safetensors", truncate), ("trainer_state.pt", garbage),
                                          ("trainer_state.pt", truncate), ("config.json", garbage)])
def test_a_damaged_last_is_one_message_naming_the_file(stopped_run_last, tmp_path, file, damage):
    from eagle3.errors import CheckpointError
    from eagle3.init.checkpoint import load_draft, load_trainer_state, resumable_last

    checkpoints = damaged_copy(stopped_run_last, tmp_path, file, damage)
    with pytest.raises(CheckpointError) as refused:
        resumable_last(checkpoints)
    assert file in str(refused.value) and "weights_only" not in str(refused.value), refused.value
    load = load_trainer_state if file == "trainer_state.pt" else load_draft
    with pytest.raises(CheckpointError, match=file):  # the rank's own loads, past the launcher's check
        load(checkpoints / "last")


@pytest.fixture(scope="module")
def stopped_run_last(stopped_copy) -> Path:
    """The stopped run's checkpoints/last (of its copy), for tests that damage copies of it."""
    return stopped_copy / "checkpoints" / "last"


@pytest.mark.slow
def test_a_save_stopped_between_its_renames_resumes_from_the_whole_one(stopped_run_last, tmp_path, caplog):
    from eagle3.init.checkpoint import load_trainer_state, resumable_last

    checkpoints = tmp_path / "checkpoints"
    shutil.copytree(stopped_run_last, checkpoints / ".last.old")
    shutil.copytree(stopped_run_last, checkpoints / ".last.tmp")
    state = torch.load(checkpoints / ".last.tmp" / "trainer_state.pt", weights_only=True)
    state["progress"]["step"] += 1  # the newer of the two
    torch.save(state, checkpoints / ".last.tmp" / "trainer_state.pt")
    with caplog.at_level("WARNING"):
        last = resumable_last(checkpoints)
    assert last == checkpoints / "last" and not (checkpoints / ".last.tmp").exists()
    assert load_trainer_state(last)["progress"]["step"] == state["progress"]["step"]
    assert ".last.tmp" in caplog.text and "resuming from" in caplog.text

    # The new one damaged: the previous one, whole, is taken instead.
    shutil.rmtree(checkpoints)
    shutil.copytree(stopped_run_last, checkpoints / ".last.old")
    shutil.copytree(stopped_run_last, checkpoints / ".last.tmp")
    truncate(checkpoints / ".last.tmp" / "model.safetensors")
    with caplog.at_level("WARNING"):
        resumable_last(checkpoints)
    assert ".last.old" in caplog.text and (checkpoints / "last" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_full_disk_during_a_save_keeps_last_and_prints_the_resume_line(cache_dir, tmp_path, monkeypatch):
    """optim.checkpoint_every=2: `last` is saved at step 2, and the save at step 4 finds the disk full."""
    from eagle3.init.checkpoint import SaveFailed, load_trainer_state
    from eagle3.train.loop import Training, train
    from eagle3.train.track import Tracker
    from factories import small_run

    run_dir = tmp_path / "run dir"
    cfg, model, loaders = small_run(cache_dir, run_dir, ["optim.max_steps=6", "optim.checkpoint_every=2"])
    real_save, saves = torch.save, []

    def save_on_a_full_disk(obj, f, *args, **kwargs):
        saves.append(f)
        if len(saves) == 1:
            return real_save(obj, f, *args, **kwargs)
        Path(f).write_bytes(b"PK\x03\x04 half")  # what a full disk leaves of it
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    with Tracker(run_dir, cfg.logger, cfg.run) as tracker, pytest.raises(SaveFailed) as failed:
        train(Training(model, loaders, cfg, tracker))
    message = str(failed.value)
    assert "no space left" in message and "resume=" in message and str(run_dir) in message, message
    checkpoints = run_dir / "checkpoints"
    assert not (checkpoints / ".last.tmp").exists() and not (checkpoints / ".last.old").exists()
    assert load_trainer_state(checkpoints / "last")["progress"]["step"] == 2  # the previous last, whole


def test_a_failure_record_that_cannot_be_written_is_a_warning(tmp_path, monkeypatch, caplog):
    from eagle3.run.job_outcome import record_failure

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("eagle3.safe_write.open_write", full)  # what every write of a run dir's file opens with
    with caplog.at_level("WARNING"):
        record_failure(tmp_path, "SaveFailed: cannot write ...")
    assert "could not be written" in caplog.text and not (tmp_path / "failure.json").exists()


# --- runs that would train nothing, and resumes whose config was edited ------------------------------------------

def composed_run(cache_dir: Path, run_dir: Path, overrides: list[str]):
    """A checked run config as the launcher types it, with its verifier and data built (the session cache)."""
    from eagle3.run.inputs import materialize_inputs

    cfg = typed_run_config(cache_dir, run_dir, overrides)
    _, data_dir = materialize_inputs(cfg)
    return cfg, data_dir


@pytest.mark.slow
def test_a_run_whose_steps_would_hold_empty_micro_batches_is_refused_before_any_rank(cache_dir, tmp_path):
    from eagle3.errors import ConfigError
    from eagle3.run.inputs import refuse_zero_steps

    cfg, data_dir = composed_run(cache_dir, tmp_path / "run", [])
    refuse_zero_steps(cfg, data_dir, None)  # the tiny default trains
    cfg, _ = composed_run(cache_dir, tmp_path / "run", ["optim.grad_accum=1000"])
    with pytest.raises(ConfigError, match=r"empty micro-batches: a step takes optim.grad_accum=1000 x 1 rank"):
        refuse_zero_steps(cfg, data_dir, None)
    # Two DDP ranks and one training row (row 0; the last row validates).
    cfg, _ = composed_run(cache_dir, tmp_path / "run", ["distributed=ddp", "distributed.nproc_per_node=2"])
    with pytest.raises(ConfigError, match=r"x 2 rank\(s\) = 2 packed micro-batches .* has 1 row"):
        refuse_zero_steps(cfg, data_dir, [0, 127])
    refuse_zero_steps(cfg, data_dir, None)

    run_dir = tmp_path / "launched"
    proc = launch([f"hydra.run.dir={run_dir}", "optim.grad_accum=1000", "logger.mode=disabled", *SMALL_DATA],
                  cache_dir)
    assert proc.returncode != 0 and "would hold empty micro-batches" in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and not (run_dir / "metrics.jsonl").exists()


@pytest.mark.slow
def test_a_resume_whose_config_was_edited_is_refused_naming_the_keys(stopped_copy, tmp_path):
    from types import SimpleNamespace

    import yaml

    from eagle3.errors import ConfigError
    from eagle3.run.launch import load_for_resume

    unedited, run_dir = tmp_path / "unedited", tmp_path / "edited"
    shutil.copytree(stopped_copy, unedited)
    shutil.copytree(stopped_copy, run_dir)
    hydra = SimpleNamespace(overrides=SimpleNamespace(task=[]))
    assert load_for_resume(unedited, hydra).run.dir == str(unedited)
    config_file = run_dir / "resolved_config.yaml"
    plain = yaml.safe_load(config_file.read_text())
    plain["optim"]["lr"], plain["optim"]["grad_accum"] = plain["optim"]["lr"] * 2, 2
    plain["logger"]["mode"] = "offline"  # how it is logged may change
    config_file.write_text(yaml.safe_dump(plain))
    before = files_of(run_dir)
    with pytest.raises(ConfigError) as refused:
        load_for_resume(run_dir, hydra)
    message = str(refused.value)
    assert "optim.grad_accum: 1 -> 2" in message and "optim.lr" in message and "logger" not in message, message
    assert files_of(run_dir) == before


def test_a_resumed_job_of_a_moved_sweep_updates_its_entry_in_the_sweep_index(tmp_path):
    from eagle3.run.job_outcome import update_resumed_sweep_job

    old, sweep = tmp_path / "made here", tmp_path / "moved sweep"
    (sweep / "1_optim.lr=0.003").mkdir(parents=True)
    jobs = [{"num": n, "name": name, "run_dir": str(old / f"{n}_{name}"), "overrides": [name], "status": status}
            for n, name, status in ((0, "optim.lr=0.001", "completed"), (1, "optim.lr=0.003", "stopped"))]
    (sweep / "index.json").write_text(json.dumps({"sweep_dir": str(old), "jobs": jobs}))
    update_resumed_sweep_job((sweep / "1_optim.lr=0.003").resolve(), "failed", None, "RunStopped: ...")
    index = json.loads((sweep / "index.json").read_text())
    assert [j["status"] for j in index["jobs"]] == ["completed", "failed"]
    assert index["jobs"][1]["run_dir"] == str((sweep / "1_optim.lr=0.003").resolve())
    assert index["sweep_dir"] == str(sweep.resolve())
