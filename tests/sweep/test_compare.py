"""Comparing runs: wandb runs grouped by sweep (read back from wandb's offline files), the table, the plot."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from commands import run_in_process
from factories import summary_json


def complete_records(run_file: Path, timeout_s: float = 60.0) -> list:
    """The records of an offline run file once its run record is in it: wandb's service process writes the file
    and may still be flushing it when the job that made it has returned (a test on the other xdist worker can read
    it that soon)."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            records = list(wandb_records(run_file))
        except Exception:  # a record cut short: the file is being written
            if time.monotonic() > deadline:
                raise
            records = []
        if any(r.WhichOneof("record_type") == "run" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.5)


def wandb_records(run_file: Path):
    """The protobuf records of an offline `.wandb` file (a LevelDB-style log: 32 KiB blocks, 7-byte headers)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    ident, magic, _ = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1
    pos, pending, block = 7, b"", 32768
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def test_offline_wandb_runs_carry_the_sweep_group_config_and_step0(sweep_2x2):
    jobs = json.loads((sweep_2x2 / "index.json").read_text())["jobs"]
    groups = set()
    for job in jobs:
        (run_file,) = Path(job["run_dir"]).glob("wandb/offline-run-*/run-*.wandb")
        run, config, tau_by_step, tags = None, {}, {}, []
        for record in complete_records(run_file):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run = record.run
                tags = list(run.tags)
                config.update({item.key: item.value_json for item in run.config.update})
            elif kind == "config":
                config.update({item.key: item.value_json for item in record.config.update})
            elif kind == "history":
                items = {item.key or "/".join(item.nested_key): item.value_json for item in record.history.item}
                if "val/tau_sim" in items:
                    tau_by_step[int(items["_step"])] = float(items["val/tau_sim"])
        groups.add(run.run_group)
        assert "${" not in json.dumps(config)
        assert json.loads(config["optim"])["lr"] in (1e-3, 3e-3)
        assert "model:tiny" in tags and "init:scratch" in tags
        assert 0 in tau_by_step and tau_by_step[0] >= 1.0
    assert len(groups) == 1 and sweep_2x2.name in groups.pop()


def test_compare_prints_one_row_per_job_with_the_swept_keys_and_plots(sweep_2x2, tmp_path):
    png = tmp_path / "sweep.png"
    proc = run_in_process(["python", "-m", "eagle3.sweep.compare", str(sweep_2x2), "--plot", str(png)])
    assert proc.returncode == 0, proc.stderr
    header, _, *rows = proc.stdout.strip().splitlines()
    assert len(rows) == 4
    columns = header.split()
    assert "optim.lr" in columns and "optim.epochs" in columns and "optim.max_steps" not in columns



    from matplotlib import image

    pixels = image.imread(png)
    assert pixels.shape[0] > 300 and pixels.shape[1] > 2 * pixels.shape[0]  # side-by-side panels


def test_compare_formats_and_ranking(sweep_2x2):
    from eagle3.sweep.compare import find_runs, rank, render, table

    runs = find_runs([sweep_2x2])
    ranked = [r.best_tau for r in rank(runs)]
    assert ranked == sorted(ranked, reverse=True)
    header, body = table(runs)
    csv_text = render(header, body, "csv")
    assert csv_text.splitlines()[0].startswith("run,status,")
    assert render(header, body, "markdown").splitlines()[1].startswith("|---")


def test_compare_lists_failed_runs(tmp_path):
    from eagle3.sweep.compare import find_runs, table

    ok, bad = tmp_path / "0_optim.lr=0.001", tmp_path / "1_optim.lr=-1"
    ok.mkdir()
    (ok / "resolved_config.yaml").write_text("optim:\n  lr: 0.001\n")
    row = {"step": 0, "split": "val", "loss": 2.0, "tau_sim": 1.0}
    (ok / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    (ok / "summary.json").write_text(summary_json(row, row, row))
    (bad / ".hydra").mkdir(parents=True)
    (bad / ".hydra" / "overrides.yaml").write_text("- optim.lr=-1\n")
    (bad / "failure.json").write_text(json.dumps({"error": "ConfigError: optim.lr: must be a positive number"}))
    header, body = table(find_runs([tmp_path]))
    assert header[:3] == ["run", "status", "optim.lr"]
    assert [r[:3] for r in body] == [["#0", "completed", "0.001"], ["#1", "failed", "-1"]]


def test_steps_to_reach_a_baselines_best(tmp_path):
    from eagle3.sweep.compare import find_runs, table

    for name, taus in {"0_scratch": [1.0, 1.2, 1.3], "1_remap": [1.1, 1.3, 1.4], "2_rebuild": [1.0, 1.05, 1.1]}.items():
        run = tmp_path / name
        run.mkdir()
        (run / "resolved_config.yaml").write_text(f"init:\n  name: {name.split('_')[1]}\n")
        rows = [{"step": 10 * i, "split": "val", "loss": 1.0, "tau_sim": t} for i, t in enumerate(taus)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        best = max(rows, key=lambda r: r["tau_sim"])
        (run / "summary.json").write_text(summary_json(rows[0], best, rows[-1]))
    header, body = table(find_runs([tmp_path]), baseline="#0")
    assert header[-1] == "steps to #0's best"
    assert {row[0]: row[-1] for row in body} == {"#1": "10", "#0": "20", "#2": "-"}


def test_confirm_says_why_the_runs_it_does_not_measure_are_not_measured(tmp_path, capsys):
    """--confirm 5 over a completed run that has its measurement, one more, and a failed run: it measures nothing
    and says of each run why."""
    from eagle3.cli.compare import main

    row = {"step": 0, "split": "val", "loss": 2.0, "tau_sim": 1.0}
    for name in ("0_measured", "1_measured"):
        run = tmp_path / name
        run.mkdir()
        (run / "resolved_config.yaml").write_text(f"optim:\n  lr: {name[0]}\n")
        (run / "summary.json").write_text(summary_json(row, row, row))
        (run / "accept_k3.json").write_text(json.dumps({"k": 3, "accept_len": 1.5, "prompts": 4,
                                                        "max_new_tokens": 8}))
    bad = tmp_path / "2_failed"
    (bad / ".hydra").mkdir(parents=True)
    (bad / ".hydra" / "overrides.yaml").write_text("- optim.lr=-1\n")
    (bad / "failure.json").write_text(json.dumps({"error": "ConfigError: optim.lr: must be a positive number"}))
    assert main([str(tmp_path), "--confirm", "5"]) == 0
    err = capsys.readouterr().err
    assert "--confirm 5: not measuring #0, #1: they have a measurement already (accept_k*.json)" in err
    assert "--confirm 5: not measuring #2 (failed): they did not complete" in err
    assert "--confirm 5: only 2 of the 3 runs completed" in err
    assert "measuring acceptance of" not in err


def test_compare_shows_step0_and_best_of_an_incomplete_run(tmp_path):
    from eagle3.sweep.compare import find_runs, table

    run = tmp_path / "0_optim.lr=0.001"
    run.mkdir()
    (run / "resolved_config.yaml").write_text("optim:\n  lr: 0.001\n")
    rows = [{"step": 0, "split": "val", "loss": 73.5, "tau_sim": 1.02},
            {"step": 5, "split": "train", "loss": 40.0},
            {"step": 10, "split": "val", "loss": 30.25, "tau_sim": 1.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    header, body = table(find_runs([tmp_path]))  # no summary.json: killed before it finished
    cells = dict(zip(header, body[0]))
    assert cells["status"] == "incomplete"
    got = (cells["tau_sim@0"], cells["loss@0"], cells["best tau_sim"], cells["best step"])
    assert got == ("1.02", "73.5", "1.5", "10")
    assert cells["final tau_sim"] == cells["final loss"] == "-"  # it has no final values


def test_compare_shows_the_readable_runs_and_names_a_cut_file(tmp_path, capsys):
    from eagle3.cli.compare import main

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


def test_the_old_module_path_names_the_new_one():
    """`python -m eagle3.compare` (before the package's move into subpackages) printed a bare "No module named"."""
    proc = run_in_process(["python", "-m", "eagle3.compare", "outputs/multirun/x y", "--format", "csv"])
    assert proc.returncode == 1 and proc.stderr == ("error: eagle3.compare moved; the command is now: eagle3 compare "
                                                    "'outputs/multirun/x y' --format csv\n")
