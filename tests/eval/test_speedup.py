"""The speedup model of eagle3.eval.speedup on fixed inputs: its arithmetic, the seed run's predicted slowdown,
the JSON it writes, where its accept rates come from, and its errors. No timing is asserted."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from eagle3.cli.speedup import main
from eagle3.eval.speedup import StepCosts, predict
from factories import ROOT, summary_json

SEED_RATES = [0.5, 0.3, 0.2]  # acceptance length 2.0 at k = 3, as the seed run served


def test_arithmetic_on_fixed_inputs():
    p = predict([0.8, 0.6], StepCosts(10.0, {1: 11.0, 2: 12.0}, 0.5))
    k1, k2 = p["rows"]
    assert k1 == pytest.approx({"k": 1, "tokens_per_step": 1.8, "step_ms": 11.5, "tokens_per_s": 1000 * 1.8 / 11.5,
                                "speedup": 1.8 / 11.5 * 10, "break_even_accept_len": 1.15})
    assert k2 == pytest.approx({"k": 2, "tokens_per_step": 2.4, "step_ms": 13.0, "tokens_per_s": 1000 * 2.4 / 13,
                                "speedup": 2.4 / 13 * 10, "break_even_accept_len": 1.3})
    assert p["best_k"] == 2 and p["pays_off"] and p["break_even_accept_len"] == pytest.approx(1.3)


def test_seed_numbers_predict_a_slowdown():
    """82 tokens/s without speculation (12.2 ms/token), about 30 ms per verify step, acceptance about 2.0: the
    model predicts about 60 tokens/s at k = 3 with 1 ms per draft forward, as the seed run served."""
    p = predict(SEED_RATES, StepCosts(1000 / 82, {1: 30.0, 2: 30.0, 3: 30.0}, 1.0))
    assert not p["pays_off"] and all(r["speedup"] < 1 for r in p["rows"])
    best = p["rows"][2]
    assert p["best_k"] == 3 and best["tokens_per_step"] == pytest.approx(2.0)
    assert best["tokens_per_s"] == pytest.approx(2000 / 33) and best["speedup"] == pytest.approx(2 / 33 * 1000 / 82)
    assert p["break_even_accept_len"] == pytest.approx(33 / (1000 / 82))  # 2.71 tokens per step to break even


def test_cli_json_and_sources(tmp_path, capsys):
    out = tmp_path / "p.json"
    main(["--accept-rates", *map(str, SEED_RATES), "--baseline-ms", "12.2", "--verify-ms", "30", "--draft-ms", "1",
          "--json", str(out)])
    assert "SLOWDOWN" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert written["best_k"] == 3 and written["break_even_accept_len"] == pytest.approx(33 / 12.2)
    keys = {"k", "tokens_per_step", "step_ms", "tokens_per_s", "speedup"}
    assert [set(r) >= keys for r in written["rows"]] == [True] * 3
    assert written["rows"][0]["speedup"] == pytest.approx(1.5 / 31 * 12.2)

    # One verify cost per k, and the rates of an eagle3.eval.accept report.
    report = tmp_path / "accept_k2.json"
    report.write_text(json.dumps({"accept_rate": [0.9, 0.7], "k": 2, "temperature": 0.7}))
    out.unlink()  # --json never overwrites
    main(["--accept", str(report), "--baseline-ms", "10", "--verify-ms", "10", "12", "--json", str(out)])
    assert "measured" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [r["step_ms"] for r in rows] == [10, 12] and rows[1]["speedup"] == pytest.approx(2.6 / 12 * 10)

    # A run dir's val full_acc_* are labelled an estimate.
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(summary_json({}, {"step": 9, "full_acc_0": 0.4, "full_acc_1": 0.2,
                                                             "tau_sim": 1.6}, {}))
    out.unlink()
    main(["--run", str(run), "--baseline-ms", "10", "--verify-ms", "11", "--json", str(out)])
    assert "ESTIMATE" in capsys.readouterr().out
    assert json.loads(out.read_text())["accept_rates"] == [0.4, 0.2]


@pytest.mark.parametrize("args,message", [
    (["--accept-rates", "0.2", "0.5", "--baseline-ms", "1", "--verify-ms", "1"], "cannot increase"),
    (["--accept-rates", "1.5", "--baseline-ms", "1", "--verify-ms", "1"], "must lie in [0, 1]"),
    (["--accept-rates", "0.5", "0.2"], "give the step costs"),
    (["--accept-rates", "0.5", "0.2", "--baseline-ms", "1", "--verify-ms", "1", "2", "3"], "one per k = 1..2"),
    (["--accept-rates", "0.5", "--baseline-ms", "0", "--verify-ms", "1"], "must be positive"),
    (["--baseline-ms", "1", "--verify-ms", "1"], "give accept rates"),
    (["--accept", "/nowhere.json", "--baseline-ms", "1", "--verify-ms", "1"], "does not exist"),
    (["--accept-rates", "0.5", "--wallclock"], "give --run"),
])
def test_bad_input_is_one_message(args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert str(exit_info.value.code).startswith("error: ") and message in str(exit_info.value.code)


def test_given_costs_need_no_torch():
    """The arithmetic path (given costs) stays light: no torch import."""
    code = ("import sys; from eagle3.cli.speedup import main; "
            "main(['--accept-rates', '0.5', '--baseline-ms', '10', '--verify-ms', '12']); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "best k = 1: 1.25x" in proc.stdout


def fake_run(path, lr, full_acc, accept_rate=None):
    """A run dir as eagle3.sweep.compare reads it: config, summary (best val row), and an accept report if given."""
    path.mkdir(parents=True)
    (path / "resolved_config.yaml").write_text(f"optim:\n  lr: {lr}\n")
    best = {"step": 10, "tau_sim": 1 + sum(full_acc), "loss": 1.0,
            **{f"full_acc_{j}": a for j, a in enumerate(full_acc)}}
    (path / "summary.json").write_text(summary_json(best, best, best))
    if accept_rate is not None:
        (path / f"accept_k{len(accept_rate)}.json").write_text(json.dumps({"k": len(accept_rate),
                                                                          "accept_rate": accept_rate}))


def test_compare_ranks_by_predicted_speedup(tmp_path):
    """A run whose tau_sim is higher but whose measured acceptance is lower ranks below by predicted speedup."""
    from eagle3.sweep.compare import find_runs, table

    fake_run(tmp_path / "0_high_tau", 1e-3, [0.7, 0.5, 0.3], accept_rate=[0.4, 0.2, 0.1])  # measured: 1.7
    fake_run(tmp_path / "1_lower_tau", 3e-3, [0.6, 0.4, 0.3])                             # estimate: 2.3
    runs = find_runs([tmp_path])
    assert [row[0] for row in table(runs)[1]] == ["#0", "#1"]  # by tau_sim
    header, body = table(runs, costs={"baseline_ms": 10.0, "verify_ms": 12.0, "draft_ms": 1.0})
    assert header[-3:] == ["pred. speedup", "at k", "rates"]
    assert [row[0] for row in body] == ["#1", "#0"]
    assert body[0][-3:] == [f"{2.3 / 15 * 10:.3f}", "3", "estimate"]
    assert body[1][-3:] == [f"{1.6 / 14 * 10:.3f}", "2", "measured"]  # k = 2 beats 1.077 at k = 1, 1.133 at 3
    with pytest.raises(SystemExit, match="needs --baseline-ms and --verify-ms"):
        from eagle3.cli.compare import main as compare_main
        compare_main([str(tmp_path), "--verify-ms", "12"])


def test_compare_reads_greedy_accept_reports_only(tmp_path):
    """An accept_k<k>_t<T>.json (sampled at T > 0) is not the greedy measurement that tau_sim is compared with:
    neither the speedup column nor --confirm's rankings take it, and --confirm would still measure the run."""
    from eagle3.sweep.compare import accept_report, find_runs, table

    fake_run(tmp_path / "0_sampled_only", 1e-3, [0.6, 0.4, 0.3])
    (tmp_path / "0_sampled_only" / "accept_k3_t0.7.json").write_text(
        json.dumps({"k": 3, "accept_rate": [0.1, 0.05, 0.0], "accept_len": 1.15, "temperature": 0.7}))
    fake_run(tmp_path / "1_greedy", 3e-3, [0.6, 0.4, 0.3], accept_rate=[0.4, 0.2, 0.1])
    sampled, greedy = find_runs([tmp_path])
    assert accept_report(sampled) is None and accept_report(greedy)["accept_rate"] == [0.4, 0.2, 0.1]
    body = table([sampled, greedy], costs={"baseline_ms": 10.0, "verify_ms": 12.0, "draft_ms": 1.0})[1]
    assert {row[0]: row[-1] for row in body} == {"#0": "estimate", "#1": "measured"}


def test_speedup_refuses_a_report_with_a_text_temperature_and_a_json_path_under_a_file(tmp_path):
    from eagle3.cli.speedup import main

    report = tmp_path / "accept_k2.json"
    report.write_text(json.dumps({"k": 2, "accept_rate": [0.8, 0.6], "temperature": "greedy"}))
    costs = ["--baseline-ms", "10", "--verify-ms", "12"]
    with pytest.raises(SystemExit, match="^error: --accept: .*temperature 'greedy', not a number"):
        main(["--accept", str(report), *costs])
    report.write_text(json.dumps({"k": 2, "accept_rate": [0.8, 0.6], "temperature": 0.0}))
    with pytest.raises(SystemExit, match=r"^error: --json: .*accept_k2.json is an existing file, not a directory"):
        main(["--accept", str(report), *costs, "--json", str(report / "out.json")])


@pytest.mark.parametrize("costs", [["--baseline-ms", "inf", "--verify-ms", "30"],
                                   ["--baseline-ms", "12", "--verify-ms", "inf"],
                                   ["--baseline-ms", "12", "--verify-ms", "30", "--draft-ms", "inf"]])
def test_speedup_refuses_infinite_step_costs(costs, capsys):
    from eagle3.cli.speedup import main

    with pytest.raises(SystemExit) as refused:
        main(["--accept-rates", "0.5", "0.3", *costs])
    assert "must be positive, finite milliseconds" in str(refused.value)
    assert "infx" not in capsys.readouterr().out
    main(["--accept-rates", "0.5", "0.3", "--baseline-ms", "12", "--verify-ms", "30"])  # finite: predicted
    assert "x" in capsys.readouterr().out
