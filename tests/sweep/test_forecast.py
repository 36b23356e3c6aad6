"""The acceptance forecast (eagle3.sweep.forecast, eagle3.sweep.curve_fit, the command eagle3.cli.forecast): the fit
on synthetic curves of known parameters, its band on noisy ones, the refusals, SmolLM2's probe curve, and the
command on a real run of the tiny default."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from commands import launch, run_in_process
from eagle3.errors import ForecastError
from eagle3.sweep.compare import read_run
from eagle3.sweep.curve_fit import Curve, fit_curve
from eagle3.sweep.forecast import Options, forecast_run
from eagle3.sweep.schedule import Schedule, schedule_of
from factories import SMALL_DATA

# docs/forecast.md's example: a SmolLM2-135M drafter's probe (issue 48), tokens -> val tau_sim, harness accept_len
SMOLLM2 = [(50, 38e3, 1.117, 1.106), (100, 76e3, 1.199, 1.187), (150, 115e3, 1.225, 1.232),
           (200, 153e3, 1.286, 1.239), (300, 233e3, 1.311, 1.270), (400, 310e3, 1.372, 1.339)]


def run_dir(path: Path, points, step0_tau: float = 1.003, summary: dict | None = None, tokens: bool = True,
            serve: dict | None = None) -> Path:
    """A run dir with val rows at (step, tokens, tau_sim, accept_len or None) after a step-0 row, and train rows."""
    path.mkdir(parents=True)
    (path / "resolved_config.yaml").write_text("model:\n  draft:\n    ttt_steps: 3\noptim:\n  eval_every: 50\n")
    rows = []
    for step, t, tau, accept in [(0, 0.0, step0_tau, None), *points]:
        row = {"step": step, "split": "val", "epoch": 0, "tokens": t, "loss": 3.0, "tau_sim": tau,
               "full_acc_0": (tau - 1) * 0.8, "full_acc_1": (tau - 1) * 0.15, "full_acc_2": (tau - 1) * 0.05}
        if accept is not None:
            row["accept_len"] = accept
        if not tokens:
            del row["tokens"]
        rows.append(row)
        if step:
            rows.append({"step": step, "split": "train", "tokens": t, "tokens_per_s": 72.0, "loss": 3.0})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (path / "summary.json").write_text(json.dumps(summary))
    if serve is not None:
        (path / "serve_vllm_k3_t0.json").write_text(json.dumps(serve))
    return path


# an eagle3.serve report at k=3, T=0 with its n-gram baseline: served step 1.3 / 0.9 plain steps
SERVED = {"k": 3, "temperature": 0, "dtype": "float32", "accept_len": 1.3, "speedup": 0.9, "tokens_per_s": 90.0,
          "plain_tokens_per_s": 100.0, "ngram": {"k": 3, "accept_len": 1.147, "tokens_per_s": 95.0, "speedup": 0.95}}


def curve_points(curve: Curve, tokens, noise: float = 0.0, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [(i + 1, t, curve(t) + noise * rng.standard_normal(), None) for i, t in enumerate(tokens)]


TOKENS = [10e3 * 2 ** (i / 2) for i in range(10)]   # 10k .. 226k, four doublings and a half


def test_a_synthetic_curve_of_known_parameters_is_recovered():
    for truth in (Curve(1.8, 0.6, 0.5, 226e3), Curve(2.6, 1.2, 0.15, 226e3), Curve(1.4, 0.2, 1.2, 226e3)):
        fit = fit_curve(TOKENS, [truth(t) for t in TOKENS], ceiling=4.0, bootstrap=10)
        got = fit.curve
        assert got.a == pytest.approx(truth.a, rel=0.02) and got.b * (got.t_ref / truth.t_ref) ** got.c == \
            pytest.approx(truth.b, rel=0.03) and got.c == pytest.approx(truth.c, rel=0.03), (truth, got)
        assert got.tokens_to(truth(1e6)) == pytest.approx(1e6, rel=0.05)


def test_the_90_percent_band_covers_the_true_curve_on_noisy_points_most_of_the_time():
    truth = Curve(1.9, 0.5, 0.4, 226e3)
    covered = {2: 0, 10: 0}
    seeds = 40
    for seed in range(seeds):
        pts = curve_points(truth, TOKENS, noise=0.01, seed=seed)
        fit = fit_curve(TOKENS, [p[2] for p in pts], ceiling=4.0, bootstrap=200, seed=seed)
        for m in covered:
            low, high = fit.value_band(m * TOKENS[-1])
            covered[m] += low <= truth(m * TOKENS[-1]) <= high
    assert all(c >= 0.7 * seeds for c in covered.values()), covered
    # and the band is an interval, not the whole range: at 2x it is within +-0.1 of the truth
    assert high - low < 0.4


def test_the_smollm2_probe_forecast_from_its_first_200k_tokens_meets_its_measured_310k_point(tmp_path):
    run = read_run(run_dir(tmp_path / "smol", SMOLLM2))
    report = forecast_run(run, Options(until_tokens=200e3, ngram=1.147, target=1.5, at=[310e3]))
    at = next(a for a in report["at"] if a["tokens"] == 310e3)
    assert abs(at["accept_len"] - 1.339) < 0.05 and at["low"] <= 1.339 <= at["high"]
    assert [p["step"] for p in report["points"]] == [0, 50, 100, 150, 200]
    ngram = next(g for g in report["reach"] if g["name"] == "n-gram")
    assert ngram["reached_at_step"] == 100 and ngram["tokens"] == 76e3
    target = next(g for g in report["reach"] if g["name"] == "target")
    assert target["within"] and 0.8e6 < target["tokens"] < 3e6 and target["hours"] > 0
    assert report["ratio"]["measured_points"] == 4 and 0.97 < report["ratio"]["value"] < 1.0


def test_a_target_above_the_fitted_asymptote_is_not_within_the_horizon(tmp_path):
    truth = Curve(1.3, 0.25, 0.8, 226e3)
    run = read_run(run_dir(tmp_path / "low", curve_points(truth, TOKENS)))
    goal = forecast_run(run, Options(target=1.5))["reach"][0]
    assert not goal["within"] and goal["never"] and goal["tokens"] is None
    out = run_in_process(["python", "-m", "eagle3.cli.forecast", str(run.path), "--target", "1.5"])
    assert out.returncode == 0 and "target 1.500 (given): not within 226M tokens (the fitted asymptote" in out.stdout


def test_too_few_val_passes_are_refused_with_the_steps_still_needed(tmp_path):
    path = run_dir(tmp_path / "short", SMOLLM2[:2])
    out = run_in_process(["python", "-m", "eagle3.cli.forecast", str(path)])
    assert out.returncode == 1 and out.stdout == ""
    assert "2 val passes after step 0, a forecast needs 4: train 2 more (about 100 more steps" in out.stderr


def test_a_curve_that_has_not_left_its_start_is_refused(tmp_path):
    flat = [(s, s * 760.0, 1.003 + 0.001 * (s % 3), None) for s in (50, 100, 150, 200, 250)]
    with pytest.raises(ForecastError, match="tau_sim has not left its start .* needs a rise of 0.02"):
        forecast_run(read_run(run_dir(tmp_path / "flat", flat)), Options())


def test_an_unfinished_run_dir_written_before_rows_recorded_tokens_is_refused(tmp_path):
    old = run_dir(tmp_path / "old", SMOLLM2, tokens=False, summary=None)
    with pytest.raises(ForecastError, match="do not record the tokens trained .* no summary.json"):
        forecast_run(read_run(old), Options())


# --- the schedule: a pilot of a cosine run knows the lr its remaining steps will have ------------------------------

COSINE = "optim:\n  eval_every: 50\n  scheduler: cosine\n  warmup_ratio: 0.03\n  lr: 0.0005\n"


def cosine_run(path: Path, truth: Curve, total: int, tokens_per_step: float = 780.0, noise: float = 0.0,
               seed: int = 0) -> Path:
    """A run dir of an unfinished cosine run planned for `total` steps (its launch.log says so), val passes every
    50 steps whose tau_sim is `truth` at their effective tokens and anneal."""
    import numpy as np

    schedule = Schedule("cosine", 0.03, total, tokens_per_step, "")
    rng = np.random.default_rng(seed)
    points = [(s, s * tokens_per_step, truth(*schedule.at_point(s, s * tokens_per_step))
               + noise * rng.standard_normal(), None) for s in range(50, total + 1, 50)]
    run_dir(path, points)
    (path / "resolved_config.yaml").write_text("model:\n  draft:\n    ttt_steps: 3\n" + COSINE)
    (path / "launch.log").write_text(f"[eagle3.train.loop][INFO] - training 5,091,264 parameters for {total} steps "
                                     f"({total} per epoch, 1 micro-batches each on 1 ranks), lr 0.0005\n")
    return path


# the SmolLM2 reference run's shape: a straight line in log-tokens, and a full anneal worth 2.5 slopes per e-fold
ANNEALED = Curve(4.0, 2.6, 0.03, 400e3, r=2.5)


def test_the_schedule_is_transformers_cosine_with_warmup_as_the_reference_run_logged_it():
    m = Schedule("cosine", 0.03, 1341, 778.0, "").multipliers()
    # the lr /work/exp/lc/seed_0's train rows logged after steps 10, 500 and 1340 (lr 5e-4): the next step's
    for step, lr in ((10, 0.00012195121951219512), (500, 0.0003613391408583757), (1340, 7.299999702503612e-10)):
        assert m[step] * 5e-4 == pytest.approx(lr, rel=1e-6, abs=1e-12)


def test_a_pilot_of_a_cosine_run_forecasts_its_annealed_end_which_the_fit_in_tokens_misses(tmp_path):
    total = 1000
    run = read_run(cosine_run(tmp_path / "cos", ANNEALED, total))
    truth_end = run.val_rows[-1]["tau_sim"]
    pilot = Options(until_step=200, at=[total * 780.0], anneal_prior=(2.5, 0.5))
    report = forecast_run(run, pilot)
    assert report["schedule"]["total_steps"] == total and report["schedule"]["source"] == "launch.log"
    end = report["planned_end"]
    assert end["steps"] == total and end["tokens"] == pytest.approx(total * 780.0)
    assert abs(end["accept_len"] - truth_end) < 0.01 and end["low"] <= truth_end <= end["high"]
    # the same points without the schedule (a config that does not name one): the fit in tokens, short by > 0.08
    (run.path / "resolved_config.yaml").write_text("model:\n  draft:\n    ttt_steps: 3\noptim:\n  eval_every: 50\n")
    old = forecast_run(read_run(run.path), pilot)
    assert old["schedule"] is None and old["planned_end"] is None
    at_end = next(a for a in old["at"] if a["tokens"] == total * 780.0)
    assert truth_end - at_end["accept_len"] > 0.08


def test_points_well_into_the_anneal_move_its_gain_from_a_wrong_prior_to_the_truth(tmp_path):
    run = read_run(cosine_run(tmp_path / "cos", ANNEALED, 1000))
    early, late = (forecast_run(run, Options(until_step=until, anneal_prior=(1.0, 1.0), bootstrap=50))["curve"]["r"]
                   for until in (200, 700))
    assert abs(late - ANNEALED.r) < 0.3 and early < late


def test_noisy_pilots_of_a_cosine_run_hold_its_end_in_their_band(tmp_path):
    truth_end = ANNEALED(*Schedule("cosine", 0.03, 1000, 780.0, "").at_point(1000, 780e3))
    covered = 0
    for seed in range(10):
        run = read_run(cosine_run(tmp_path / f"cos{seed}", ANNEALED, 1000, noise=0.01, seed=seed))
        end = forecast_run(run, Options(until_step=250, bootstrap=200, seed=seed))["planned_end"]
        covered += end["low"] <= truth_end <= end["high"]
    assert covered >= 8


def test_pilots_of_planned_runs_are_ranked_by_the_accept_len_their_runs_end_at(tmp_path):
    truths = {"0_low": Curve(4.0, 2.6, 0.03, 400e3, r=0.5), "1_high": Curve(4.0, 2.6, 0.03, 400e3, r=2.5),
              "2_mid": Curve(4.0, 2.6, 0.03, 400e3, r=1.5)}
    for name, truth in truths.items():
        cosine_run(tmp_path / "sweep" / name, truth, 1000)
    out = run_in_process(["python", "-m", "eagle3.cli.forecast", str(tmp_path / "sweep"), "--until", "700"])
    assert out.returncode == 0, out.stderr
    assert "3 runs ranked by accept_len at the end of the planned run:" in out.stdout
    ranks = [line.split()[1] for line in out.stdout.splitlines()[-3:]]
    assert ranks == ["#1", "#2", "#0"]

def test_the_planned_total_comes_from_the_summary_then_launch_log_then_max_steps(tmp_path):
    path = cosine_run(tmp_path / "cos", ANNEALED, 1000)
    config = {"optim.scheduler": "cosine", "optim.warmup_ratio": 0.03}
    assert schedule_of(path, config, None, 7800.0, 10).total_steps == 1000
    assert schedule_of(path, config, type("S", (), {"steps": 1200})(), 7800.0, 10).total_steps == 1200
    (path / "launch.log").unlink()
    assert schedule_of(path, config, None, 7800.0, 10) is None
    assert schedule_of(path, config | {"optim.max_steps": 300}, None, 7800.0, 10).source == "optim.max_steps"
    assert schedule_of(path, {"optim.scheduler": "cosine_with_restarts"}, None, 7800.0, 10) is None


def test_several_runs_are_ranked_by_the_tokens_they_need_to_reach_the_target(tmp_path):
    fast, slow = Curve(2.2, 0.7, 0.5, 226e3), Curve(2.2, 0.9, 0.3, 226e3)
    for name, curve in (("0_slow", slow), ("1_fast", fast)):
        run_dir(tmp_path / "sweep" / name, curve_points(curve, TOKENS))
    out = run_in_process(["python", "-m", "eagle3.cli.forecast", str(tmp_path / "sweep"), "--target", "1.8",
                          "--json"])
    assert out.returncode == 0, out.stderr
    ranking = json.loads(out.stdout)["ranking"]
    assert [r["label"] for r in ranking] == ["#1", "#0"]
    assert ranking[0]["reach"][0]["tokens"] == pytest.approx(fast.tokens_to(1.8), rel=0.05)


def test_the_served_ngram_and_step_give_the_goal_and_the_predicted_speedup(tmp_path):
    run = read_run(run_dir(tmp_path / "served", SMOLLM2, serve=SERVED))
    report = forecast_run(run, Options())
    assert report["reach"][0]["name"] == "n-gram" and report["reach"][0]["accept_len"] == 1.147
    # the served step costs 1.3 / 0.9 plain steps at k=3: the speedup at accept_len A is A / that
    for a in report["at"]:
        assert a["speedup"] == pytest.approx(a["accept_len"] * 0.9 / 1.3, rel=1e-6)


@pytest.mark.slow
def test_the_command_forecasts_a_short_real_run_of_the_tiny_default(cache_dir, tmp_path):
    run = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run}", "optim.epochs=2", "optim.eval_every=3", *SMALL_DATA], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    val = [r for r in rows if r["split"] == "val"]
    train = {r["step"]: r["tokens"] for r in rows if r["split"] == "train"}
    assert len(val) >= 5 and val[0]["tokens"] == 0
    assert all(train[r["step"]] == r["tokens"] for r in val[1:])  # each val pass's tokens: its step's own
    out = run_in_process(["python", "-m", "eagle3.cli.forecast", str(run), "--json", "--at", "1M", "--target", "2"])
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert [set(a) >= {"tokens", "accept_len", "low", "high"} for a in report["at"]] == [True] * len(report["at"])
    assert 1e6 in [a["tokens"] for a in report["at"]] and report["tokens_so_far"] == val[-1]["tokens"]
    assert all(math.isfinite(a["accept_len"]) and a["low"] <= a["high"] for a in report["at"])
    assert report["reach"][0]["name"] == "target" and report["tokens_per_s"] > 0
    text = run_in_process(["python", "-m", "eagle3.cli.forecast", str(run)])
    assert text.returncode == 0 and "accept_len" in text.stdout and "90% interval" in text.stdout


def test_compare_shows_the_forecast_columns_and_a_dash_for_a_run_too_short_to_forecast(tmp_path):
    run_dir(tmp_path / "sweep" / "0_long", SMOLLM2, serve=SERVED)
    run_dir(tmp_path / "sweep" / "1_short", SMOLLM2[:2])
    out = run_in_process(["python", "-m", "eagle3.sweep.compare", str(tmp_path / "sweep"), "--forecast",
                          "--format", "csv"])
    assert out.returncode == 0, out.stderr
    import csv

    rows = {r["run"]: r for r in csv.DictReader(out.stdout.splitlines())}
    assert 1.5 < float(rows["#0"]["fc. accept_len@10x"]) < 1.7 and rows["#0"]["fc. tokens to n-gram"] == "76k"
    assert rows["#1"]["fc. accept_len@10x"] == "-"


def test_the_benchmark_compares_a_pilots_forecast_with_the_rest_of_its_run(tmp_path):
    path = run_dir(tmp_path / "smol", SMOLLM2)
    out = tmp_path / "bench.json"
    proc = run_in_process(["python", "bench/forecast.py", str(path), "--share", "0.5", "--line", "1.147", "--json",
                           str(out)])
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["final_accept_len"] == 1.339 and result["final_measured"] and result["pilot_points"] == 5
    assert abs(result["predicted_accept_len"] - 1.339) < 0.05
    assert result["actual_tokens_to_line"] == pytest.approx(38e3 * (76e3 / 38e3) ** ((1.147 - 1.106) / (1.187 - 1.106)))
    assert "tokens to pass 1.147: forecast" in proc.stdout


def test_the_forecast_goes_into_the_runs_own_offline_wandb_run_as_summary_values(tmp_path):
    from test_compare import complete_records

    path = run_dir(tmp_path / "wb", SMOLLM2)
    with (path / "resolved_config.yaml").open("a") as f:
        f.write("logger:\n  mode: offline\n  project: forecast-test\n  entity: null\n")
    (path / "wandb_run_id").write_text("abc123forecast\n")
    out = run_in_process(["python", "-m", "eagle3.cli.forecast", str(path), "--target", "1.5", "--wandb"],
                         WANDB_SILENT="true")
    assert out.returncode == 0, out.stderr
    assert "forecast logged to wandb run abc123forecast (offline)" in out.stderr
    run_file, = path.glob("wandb/offline-run-*/run-abc123forecast.wandb")
    summary = {}
    for record in complete_records(run_file):
        if record.WhichOneof("record_type") == "summary":
            summary |= {item.key: json.loads(item.value_json) for item in record.summary.update}
    assert summary["forecast/accept_len@10x"] > 1.4 and summary["forecast/within_target"] is True
    assert summary["forecast/tokens_to_target"] > 310e3


def test_a_run_without_wandb_is_left_alone(tmp_path):
    path = run_dir(tmp_path / "nowb", SMOLLM2)
    out = run_in_process(["python", "-m", "eagle3.cli.forecast", str(path), "--wandb"])
    assert out.returncode == 0 and "no wandb run" in out.stderr and not (path / "wandb").exists()


def test_the_command_and_its_refusal_import_neither_torch_nor_speculators(tmp_path):
    import subprocess
    import sys

    from factories import ROOT

    short = run_dir(tmp_path / "short", SMOLLM2[:3])
    for args in (["--help"], [str(short)], [str(run_dir(tmp_path / "whole", SMOLLM2)), "--target", "1.5"]):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "eagle3.cli.forecast", *args], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == (1 if args == [str(short)] else 0), proc.stderr[-2000:]
        imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
        assert "torch" not in imported and "speculators" not in imported, args


def test_a_measured_best_checkpoint_carries_its_ratio_to_the_forecast_and_old_rows_count_tokens_by_step(tmp_path):
    from factories import summary_json

    plain = [(s, t, tau, None) for s, t, tau, _ in SMOLLM2]
    path = run_dir(tmp_path / "measured", plain, tokens=False)
    row = {"step": 400, "split": "val", "loss": 3.0, "tau_sim": 1.372}
    (path / "summary.json").write_text(summary_json({**row, "step": 0, "tau_sim": 1.003}, row, row,
                                                    steps=400, tokens=310e3, tokens_per_s=72.0))
    (path / "accept_k3.json").write_text(json.dumps({"k": 3, "temperature": 0.0, "accept_len": 1.339,
                                                     "checkpoint": str(path / "checkpoints" / "best")}))
    report = forecast_run(read_run(path), Options())
    assert report["ratio"] == {"value": pytest.approx(1.339 / 1.372), "measured_points": 1,
                               "sources": ["accept_k3.json"]}
    assert report["points"][-1]["accept_len"] == 1.339 and report["points"][1]["tokens"] == pytest.approx(38750.0)
    assert report["tokens_per_s"] == 72.0
