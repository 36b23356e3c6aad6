"""The run dir's room (eagle3.rundir.files): its JSON files are typed records, read back equal to what was written, and
a file that is not one (cut short, mistyped) is one message naming it; writes are whole or not at all."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from commands import launch, launch_process
from eagle3.errors import ConfigError, UserError
from eagle3.rundir.files import DataCheck, FailureRecord, InitReport, RunDir
from eagle3.rundir.progress import Progress, RunSummary
from eagle3.rundir.sweep_index import IndexEntry, SweepIndex
from factories import summary_json

ROW = {"step": 4, "split": "val", "epoch": 0, "loss": 2.5, "tau_sim": 1.25, "full_acc_0": 0.5}


def test_every_record_reads_back_equal_to_what_was_written(tmp_path):
    run = RunDir(tmp_path)
    summary = RunSummary.of(Progress(step=4, tokens=64.0, train_wall_s=2.0, step0=ROW, best=ROW, final=ROW),
                            Path("/v"), Path("/d"), "cpu", 2)
    run.write_summary(summary)
    assert run.read_summary() == summary
    assert json.loads(run.file("summary.json").read_text())["checkpoints"] == {"last": "checkpoints/last",
                                                                              "best": "checkpoints/best"}
    run.write_failure(FailureRecord("RunStopped: the loss is NaN", "Traceback ..."))
    assert run.read_failure() == FailureRecord("RunStopped: the loss is NaN", "Traceback ...")
    report = InitReport.from_dict({"initializer": "scratch", "flags": {"norm_before_residual": True}})
    run.write_init_report(report)
    assert json.loads(run.file("init_report.json").read_text()) == {"initializer": "scratch",
                                                                    "flags": {"norm_before_residual": True}}
    assert run.read_init_report() == report
    check = DataCheck(data_dir="/d", rows=3, bad=1, counts={"token_id": 1}, full=False,
                      first_bad=[{"row": 2, "kind": "token_id", "detail": "id 99"}], policy="skip", skipped_rows=[2])
    run.write_data_check(check)
    assert run.read_data_check() == check
    assert "source_skipped" not in json.loads(run.file("data_check.json").read_text())  # the keys as before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data_check.json", "failure.json", "init_report.json",
                                                          "summary.json"]  # no temporary file left


@pytest.mark.parametrize("text, why", [
    ('{"steps": 3, "tokens": 1.0, "tokens_per', "cut short"),
    ("[1, 2]", "not a JSON object"),
    (None, "'steps' is '3'"),
])
def test_a_summary_that_is_not_one_is_one_message_naming_the_file(tmp_path, text, why):
    if text is None:
        text = summary_json(ROW, ROW, ROW).replace('"steps": 4', '"steps": "3"')
    (tmp_path / "summary.json").write_text(text)
    with pytest.raises(ConfigError) as refused:
        RunDir(tmp_path).read_summary()
    message = str(refused.value)
    assert str(tmp_path / "summary.json") in message and "cannot be read as a run summary" in message
    assert why in message or why == "cut short"


def test_a_failure_record_and_an_init_report_with_wrong_types_are_refused(tmp_path):
    (tmp_path / "failure.json").write_text(json.dumps({"error": 3}))
    with pytest.raises(ConfigError, match=r"failure.json: cannot be read as a failure record \('error' is 3"):
        RunDir(tmp_path).read_failure()
    (tmp_path / "init_report.json").write_text(json.dumps({"flags": {}}))
    with pytest.raises(ConfigError, match=r"init_report.json: cannot be read as an init report \(no 'initializer'"):
        RunDir(tmp_path).read_init_report()


def test_the_sweep_index_keeps_its_keys_and_replaces_an_entry_by_number(tmp_path):
    index = SweepIndex(tmp_path)
    summary = RunSummary.from_dict(json.loads(summary_json(ROW, ROW, ROW)))
    index.put(IndexEntry(num=1, name="optim.lr=0.1", run_dir="/s/1", overrides=["optim.lr=0.1"], status="failed",
                         error="RunStopped: NaN"))
    index.put(IndexEntry(num=0, name="optim.lr=0.01", run_dir="/s/0", overrides=["optim.lr=0.01"],
                         status="completed").with_results(summary))
    index.put(IndexEntry(num=1, name="optim.lr=0.1", run_dir="/s/1", overrides=["optim.lr=0.1"], status="stopped",
                         resume="python launch.py resume=/s/1"))
    plain = json.loads((tmp_path / "index.json").read_text())
    assert plain["sweep_dir"] == str(tmp_path.resolve())
    assert plain["jobs"][0] == {"num": 0, "name": "optim.lr=0.01", "run_dir": "/s/0", "overrides": ["optim.lr=0.01"],
                                "status": "completed", "error": None, "steps": 4, "best_tau_sim": 1.25,
                                "best_step": 4, "final_loss": 2.5, "final_tau_sim": 1.25}
    assert [(e.num, e.status) for e in index.entries()] == [(0, "completed"), (1, "stopped")]
    (tmp_path / "index.json").write_text('{"jobs": [{"num": "zero"}]}')
    with pytest.raises(ConfigError, match="index.json is not a sweep index"):
        index.entries()


def test_a_failed_run_writes_failure_json_through_its_record(tmp_path):
    from eagle3.run.job_outcome import record_failure

    record_failure(tmp_path, "DataError: no rows", "Traceback (most recent call last): ...")
    assert RunDir(tmp_path).read_failure() == FailureRecord("DataError: no rows",
                                                            "Traceback (most recent call last): ...")


@pytest.mark.parametrize("override", ["distributed.max_restarts=1", "+distributed.max_restarts=0"])
def test_max_restarts_is_refused_as_an_unknown_key_before_anything_is_written(override, tmp_path):
    """The key is gone (elastic restarts would rebuild the draft instead of resuming it; a run never restarts): Hydra
    refuses it as a key the schema lacks, and added with `+`, typing the config does, in one line."""
    run_dir = tmp_path / "run"
    proc = launch([override, f"hydra.run.dir={run_dir}"], tmp_path / "cache", timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert "Key 'max_restarts' not in 'DistributedConfig'" in proc.stderr, proc.stderr
    if override.startswith("+"):
        assert proc.stderr.strip().splitlines() == [
            "error: distributed.max_restarts: Key 'max_restarts' not in 'DistributedConfig'"]
    assert not run_dir.exists()


def test_compare_reads_summary_json_through_its_record(tmp_path):
    """A summary.json with the val rows but mistyped fields is not taken as a finished run: compare names the file."""
    from eagle3.sweep.compare import find_runs

    row = {"step": 0, "split": "val", "loss": 2.0, "tau_sim": 1.0}
    for name, steps in (("0_ok", 4), ("1_bad", "four")):
        run = tmp_path / name
        run.mkdir()
        (run / "resolved_config.yaml").write_text("optim:\n  lr: 0.001\n")
        (run / "summary.json").write_text(summary_json(row, row, row, steps=steps))
    ok, bad = find_runs([tmp_path])
    assert ok.status == "completed" and ok.summary is not None and ok.summary.steps == 4
    assert bad.status == "unreadable" and "1_bad/summary.json: cannot be read as a run summary" in (bad.error or "")


# --- no file of a run dir is written through a symlink ------------------------------------------------------------

class FakeDraft:
    """What save_checkpoint calls on a model: save_pretrained writes a weights file into a new dir."""

    def save_pretrained(self, out: str, state_dict: dict) -> None:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "model.safetensors").write_text("new")


def save(run: Path, name: str = "best", state: dict | None = None) -> None:
    from eagle3.init.checkpoint import save_checkpoint

    save_checkpoint(FakeDraft(), {}, run / "checkpoints" / name, state)  # type: ignore[arg-type]


def summary() -> RunSummary:
    return RunSummary.of(Progress(step=4, step0=ROW, best=ROW, final=ROW), Path("/v"), Path("/d"), "cpu", 1)


def rank_0_log(run: Path) -> None:
    import logging

    from eagle3.console import setup_rank_logging

    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        setup_rank_logging(run, 0)
        logging.getLogger("probe").info("a line")
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:], root.level = handlers, level


def take_lock(run: Path) -> None:
    from eagle3 import safe_write

    RunDir(run).hold()
    safe_write.release(run / ".lock")


def accept(run: Path) -> None:
    from eagle3.cli.accept import main

    main(["--run", str(run), "--k", "3"])


def serve(run: Path) -> None:
    """eagle3.serve with an engine that fails as it starts (after its log is opened), as test_serve's fake one."""
    from eagle3.cli.serve import main
    from factories import FAKE_ENGINE

    engine = run.parent / "fake-python"
    engine.write_text(FAKE_ENGINE)
    engine.chmod(0o755)
    main([str(run), "--k", "3", "--python", str(engine)])


def rank_error(run: Path) -> None:
    from eagle3.rundir.rank_errors import write_rank_error

    write_rank_error(run, 0, ValueError("a bug"))  # swallows what it cannot write: the rank's log holds it


def tracker(run: Path) -> None:
    from eagle3.config import LoggerConfig, LoggerMode
    from eagle3.train.track import Tracker

    with Tracker(run, LoggerConfig(mode=LoggerMode.disabled)) as t:
        t.log({"step": 1, "split": "train", "loss": 1.0})


# name -> (a dir or a file, what writes it, and what it does with a link there: refuses it with one message, keeps
# it and writes nothing through it (a rank's error record: its log has the error), or removes it (a temporary
# name of its own)); `best` and `last` exist as real checkpoints before the write where a name inside them is linked
WRITERS = {
    "resolved_config.yaml": (False, lambda r: RunDir(r).write_config({"seed": 0}), "refuse"),
    "metrics.jsonl": (False, tracker, "refuse"),
    "summary.json": (False, lambda r: RunDir(r).write_summary(summary()), "refuse"),
    "failure.json": (False, lambda r: RunDir(r).write_failure(FailureRecord("DataError: x")), "refuse"),
    "init_report.json": (False, lambda r: RunDir(r).write_init_report(InitReport("scratch")), "refuse"),
    "data_check.json": (False, lambda r: RunDir(r).write_data_check(DataCheck("/d", 1, 0, {}, True, [], "error", [])),
                        "refuse"),
    "launch.log": (False, rank_0_log, "refuse"),
    ".lock": (False, take_lock, "refuse"),
    "checkpoints": (True, save, "refuse"),
    "checkpoints/best": (True, save, "refuse"),
    "checkpoints/last": (True, lambda r: save(r, "last", {"step": 1}), "refuse"),
    "checkpoints/.best.tmp": (True, save, "remove"),
    "checkpoints/.best.old": (True, save, "remove"),
    "checkpoints/best/model.safetensors": (False, save, "remove"),
    "checkpoints/last/trainer_state.pt": (False, lambda r: save(r, "last", {"step": 1}), "remove"),
    "rank_errors": (True, rank_error, "keep"),
    "rank_errors/rank_0.json": (False, rank_error, "keep"),
    "accept_k3.json": (False, accept, "refuse"),
    "serve_vllm_k3_t0.json": (False, serve, "refuse"),
    "serve_vllm_k3_t0.log": (False, serve, "refuse"),
    "serve_vllm_plain_t0.log": (False, serve, "refuse"),
}


@pytest.mark.parametrize("live", [False, True], ids=["dangling", "live"])
@pytest.mark.parametrize("name", WRITERS)
def test_no_writer_of_a_run_dir_writes_through_a_symlink_at_any_of_its_names(name, live, tmp_path, monkeypatch):
    from eagle3.errors import UserError
    from factories import fake_run_dir

    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("FAKE_ENGINE_MODE", "fail")
    is_dir, write, expected = WRITERS[name]
    run = tmp_path / "run"
    if write in (accept, serve):
        fake_run_dir(tmp_path, "run", tmp_path / "verifier")  # a finished run as eval.accept and serve read it
    run.mkdir(exist_ok=True)
    if name.startswith(("checkpoints/best/", "checkpoints/last/", "checkpoints/.best.old")):
        save(run, "last" if "last" in name else "best")
    outside = tmp_path / "outside"
    target = outside / name.replace("/", "_")
    if live:
        (target if is_dir else outside).mkdir(parents=True, exist_ok=True)
        (target / "keep" if is_dir else target).write_text("keep")
    link = run / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_dir():
        import shutil

        shutil.rmtree(link)
    link.unlink(missing_ok=True)
    link.symlink_to(target, target_is_directory=is_dir)
    before = sorted((str(p), p.read_text()) for p in outside.rglob("*") if p.is_file()) if outside.exists() else []
    if name.count("/") < 2:  # the check a launch, a resume and a serve make before anything starts (a name inside
        # a checkpoint goes with the dir it is in, which a save replaces whole)
        with pytest.raises(ConfigError, match="symlinks that lead outside it or nowhere"):
            RunDir(run).refuse_links()

    if expected == "refuse":
        with pytest.raises((UserError, SystemExit)) as refused:
            write(run)
        message = str(refused.value)
        assert "is a symlink" in message and name.split("/")[-1] in message and "Traceback" not in message, message
        assert link.is_symlink()
    else:
        write(run)
        assert link.is_symlink() == (expected == "keep")
    after = sorted((str(p), p.read_text()) for p in outside.rglob("*") if p.is_file()) if outside.exists() else []
    assert after == before, f"written outside the run dir through {name}"
    assert live or not target.exists()


@pytest.mark.parametrize("name", ["launch.log", "checkpoints/best"])
def test_a_resume_through_a_link_leading_out_is_refused_before_any_rank_starts(name, trained_run, tmp_path):
    import shutil

    from commands import launch

    run, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(trained_run, run, symlinks=True)
    outside.mkdir()
    link = run / name
    if name == "launch.log":
        (outside / "x.log").write_text("keep")
        link.unlink(missing_ok=True)
        link.symlink_to(outside / "x.log")
    else:
        (outside / "best").mkdir()
        (outside / "best" / "keep").write_text("keep")
        shutil.rmtree(link)
        link.symlink_to(outside / "best", target_is_directory=True)
    before = sorted((str(p), p.read_text()) for p in outside.rglob("*") if p.is_file())
    proc = launch([f"resume={run}"], tmp_path / "cache")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"{name} -> {outside}" in proc.stderr and "nothing was written" in proc.stderr
    assert sorted((str(p), p.read_text()) for p in outside.rglob("*") if p.is_file()) == before
    assert not list((run / "checkpoints").glob(".best.*"))


def resume_hydra(run_dir: Path):
    """What eagle3.run.resume.load_for_resume reads of Hydra's config for `python launch.py resume=<run_dir>`."""
    from types import SimpleNamespace

    return SimpleNamespace(overrides=SimpleNamespace(task=[f"resume={run_dir}"]))


def test_a_resume_of_a_run_dir_in_use_names_the_process_holding_it(tmp_path):
    """A resume refused because another process holds the run advised "choose another hydra.run.dir", which a resume
    cannot do: it names the holder's pid, and says to wait for it or stop it."""

    from eagle3 import safe_write
    from eagle3.run.resume import load_for_resume

    run = tmp_path / "run"
    run.mkdir()
    (run / "resolved_config.yaml").write_text("run: {}\n")
    RunDir(run).hold()  # as the process running (or resuming) the run holds it
    try:
        with pytest.raises(ConfigError) as refused:
            load_for_resume(run, resume_hydra(run))
    finally:
        safe_write.release(run / ".lock")
    pid = os.getpid()
    assert str(refused.value) == (f"resume: {run} is in use by process {pid}, which is running or resuming this run; "
                                  f"nothing was written: wait for it to end, or stop it (kill -TERM {pid}: a stopped "
                                  f"run saves its state) and resume again")


def files_in(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_launch_into_a_run_dir_in_use_is_refused_before_it_writes_anything_there(tmp_path):
    """While run A held its dir (building its data), a second launch into it was refused only after Hydra had
    rewritten A's .hydra/{config,hydra,overrides}.yaml and the launcher had appended B's plan: lines to A's
    launch.log: the holder is seen before anything is written, every file stays byte for byte."""
    from eagle3 import safe_write

    run = tmp_path / "run"
    (run / ".hydra").mkdir(parents=True)
    for name in ("config.yaml", "hydra.yaml", "overrides.yaml"):
        (run / ".hydra" / name).write_text(f"A's {name}\n")
    (run / "launch.log").write_text("[A] building the data\n")
    (run / "resolved_config.yaml").write_text("A's config\n")
    RunDir(run).hold()  # as run A holds it while it builds its data
    try:
        before = files_in(run)
        proc = launch_process([f"hydra.run.dir={run}", "optim.lr=3e-3"], tmp_path / "cache")
        after = files_in(run)
    finally:
        safe_write.release(run / ".lock")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"error: {run} is in use by another run" in proc.stderr and "nothing was written" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert after == before


def test_a_link_at_the_online_hidden_cache_is_refused_before_anything_is_built_or_written(tmp_path):
    """A link at online_hidden_cache (data.cache_gb's dir) to a dir inside the run was refused only after the data
    build, with failure.json written, under a message saying nothing was written: it is a name the run writes."""
    run = tmp_path / "run"
    (run / "inside").mkdir(parents=True)
    (run / "online_hidden_cache").symlink_to(run / "inside")
    proc = launch(["data=online", "data.cache_gb=1", "optim.epochs=2", f"hydra.run.dir={run}"], tmp_path / "cache")
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"online_hidden_cache -> {run / 'inside'}" in proc.stderr and "nothing was written" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in run.iterdir()) == ["inside", "online_hidden_cache"]
    assert list((run / "inside").iterdir()) == [] and not (tmp_path / "cache").exists()


def test_a_new_run_and_resume_agree_on_a_run_dir_that_took_no_step_or_saved_no_last(tmp_path):
    """A run stopped before its first step: resume= said checkpoints/last is missing and a new run there said to
    resume it, each sending the user to the other. Both say what resume= does: start it again from step 0; for a
    run that took steps and saved no last, both say there is nothing to continue."""
    from eagle3 import safe_write
    from eagle3.console import resume_command
    from eagle3.errors import CheckpointError
    from eagle3.run.resume import load_for_resume

    run = tmp_path / "run"
    (run / "checkpoints" / "best").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({**ROW, "step": 0}) + "\n")
    with pytest.raises(ConfigError) as refused:
        RunDir(run).refuse_to_overwrite()
    assert str(refused.value) == (f"{run} already holds a run stopped before its first step; nothing was "
                                  f"overwritten: start it again from step 0 with {resume_command(run)}, or choose "
                                  f"another hydra.run.dir")
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({**ROW, "split": "train"}) + "\n")
    with pytest.raises(ConfigError, match="took steps .metrics.jsonl. and saved no checkpoints/last, so there is "
                                          "nothing to continue; nothing was overwritten: choose another"):
        RunDir(run).refuse_to_overwrite()
    (run / "resolved_config.yaml").write_text("run: {}\n")
    try:
        with pytest.raises(CheckpointError, match="saved no checkpoints/last: there is nothing to continue from; "
                                                  "start a new run in another dir"):
            load_for_resume(run, resume_hydra(run))
    finally:
        safe_write.release(run / ".lock")


def test_a_resumed_runs_config_key_this_version_does_not_know_is_refused_naming_the_file(tmp_path):
    """The refusal named the key only, as if it came from the command line (which resume= takes no key from)."""
    import yaml

    from eagle3.config import plain_config
    from eagle3.run.resume import load_for_resume
    from factories import typed_run_config

    run = tmp_path / "run"
    plain = plain_config(typed_run_config(tmp_path / "cache", run, []))
    plain["optim"]["lr_warmup"] = 0.1  # written by another version, or edited
    run.mkdir()
    (run / "resolved_config.yaml").write_text(yaml.safe_dump(plain))
    with pytest.raises(ConfigError) as refused:
        load_for_resume(run, resume_hydra(run))
    assert str(refused.value).startswith(f"resume: {run / 'resolved_config.yaml'} (the run's config, read through "
                                         f"this version's schemas): optim.lr_warmup: "), refused.value


def test_a_resume_of_a_completed_run_says_it_is_complete_and_trains_nothing(trained_run, cache_dir, tmp_path):
    """`python launch.py resume=R` of a completed run loaded the data and the ranks, trained no step, wrote its
    summary again and ended without a word of why; it says the run is complete and exits 0 before anything runs."""
    import shutil

    from commands import launch

    run = tmp_path / "run"
    shutil.copytree(trained_run, run, ignore=shutil.ignore_patterns("wandb"))
    before = {p.name: p.read_bytes() for p in (run / "summary.json", run / "metrics.jsonl")}
    steps = json.loads(before["summary.json"])["steps"]
    proc = launch([f"resume={run}"], cache_dir, WANDB_MODE="offline")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{run} is already complete: it trained all its {steps} steps (summary.json; best val tau_sim " in \
        proc.stdout, proc.stdout
    assert "nothing to resume, nothing was trained" in proc.stdout and "resuming at step" not in proc.stdout
    assert {p.name: p.read_bytes() for p in (run / "summary.json", run / "metrics.jsonl")} == before
    assert "Traceback" not in proc.stderr


def test_a_run_dir_with_symlinks_leading_out_is_refused_and_nothing_is_written_through(tmp_path):
    from eagle3.rundir.files import RunDir

    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    (run_dir / "wandb" / "run-1").mkdir(parents=True)
    (run_dir / "wandb" / "latest-run").symlink_to("run-1")  # inside the run dir (as wandb links): allowed
    RunDir(run_dir).refuse_to_overwrite()
    (run_dir / ".hydra").mkdir()
    for name in ("resolved_config.yaml", "summary.json", ".hydra/config.yaml"):
        (run_dir / name).symlink_to(outside / Path(name).name)  # dangling, and leading out
    with pytest.raises(ConfigError, match="symlinks that lead outside it or nowhere") as refused:
        RunDir(run_dir).refuse_to_overwrite()
    message = str(refused.value)
    assert "summary.json -> " in message and ".hydra/config.yaml -> " in message and "latest-run" not in message
    (run_dir / ".lock").symlink_to(outside / ".lock")
    with pytest.raises(UserError, match=r"\.lock is a symlink"):
        RunDir(run_dir).hold()
    assert list(outside.iterdir()) == []


@pytest.mark.slow
def test_launch_in_a_dir_of_dangling_symlinks_writes_nothing_outside_it(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "outside"
    run_dir.mkdir()
    outside.mkdir()
    for name in (".lock", "launch.log", "resolved_config.yaml", "metrics.jsonl", "summary.json", "failure.json"):
        (run_dir / name).symlink_to(outside / name)
    proc = launch([f"hydra.run.dir={run_dir}", "optim.max_steps=1"], tmp_path / "cache")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "symlinks that lead outside it or nowhere" in proc.stderr
    assert list(outside.iterdir()) == [] and not (run_dir / ".hydra").exists()
