"""Recipe search: the Optuna sweeper (hydra/sweeper=optuna), the run's objective, and `compare --confirm`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from commands import launch, run_in_process
from eagle3.config import Objective, validate
from eagle3.errors import ConfigError
from factories import ROOT, SMALL_DATA, compose_cfg

LR, WARMUP = "optim.lr=tag(log, interval(1e-3, 1e-2))", "optim.warmup_ratio=interval(0, 0.1)"
# Short trials: a few steps of the small dataset, no wandb.
SHORT = ["optim.max_steps=4", "logger.mode=disabled", *SMALL_DATA]


def load_study(sweep: Path):
    import optuna

    return optuna.load_study(study_name="eagle3", storage=f"sqlite:///{sweep / 'study.db'}")


def run_dirs(sweep: Path) -> dict[int, Path]:
    return {int(d.name.split("_", 1)[0]): d for d in sweep.iterdir() if d.is_dir() and d.name[0].isdigit()}


def index_jobs(sweep: Path) -> list[dict]:
    return json.loads((sweep / "index.json").read_text())["jobs"]


def study_command(sweep: Path, n_trials: int, *extra: str) -> list[str]:
    return ["-m", "hydra/sweeper=optuna", f"hydra.sweeper.n_trials={n_trials}", LR, WARMUP, *SHORT, *extra,
            f"hydra.sweep.dir={sweep}"]


def test_search_space_follows_hydra_override_syntax():
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    from hydra_plugins.eagle3_optuna_sweeper.search_space import parse_search_space, to_override

    space, fixed = parse_search_space([LR, WARMUP, "optim.epochs=range(1, 6, 2)",
                                       "optim.grad_accum=int(interval(1, 4))", "optim.scheduler=choice(cosine, linear)",
                                       "seed=1,2", "optim.max_steps=4"])
    assert space["optim.lr"] == FloatDistribution(1e-3, 1e-2, log=True)
    assert space["optim.warmup_ratio"] == FloatDistribution(0.0, 0.1)
    assert space["optim.epochs"] == IntDistribution(1, 5, step=2)  # Hydra's range excludes its stop
    assert space["optim.grad_accum"] == IntDistribution(1, 4)
    assert space["optim.scheduler"] == CategoricalDistribution(["cosine", "linear"])
    assert space["seed"] == CategoricalDistribution([1, 2])
    assert fixed == ["optim.max_steps=4"]
    assert to_override("logger.project", "a b") == "logger.project=a\\ b" and to_override("x", None) == "x=null"


def test_objective_is_typed_and_accept_len_needs_measured_acceptance():
    def plain(overrides: list[str]) -> dict:
        return OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True)

    assert compose_cfg().objective.value == "tau_sim"
    with pytest.raises(Exception, match="objective"):
        compose_cfg(["objective=accept_lenn"])  # a typo fails at composition, it never runs tau_sim instead
    for overrides in (["objective=accept_len"], ["objective=accept_len", "eval.accept.enabled=true",
                                                 "eval.accept.every=2"]):
        with pytest.raises(ConfigError, match="^objective: .*eval.accept.enabled=true"):
            validate(plain(overrides))
    assert validate(plain(["objective=accept_len", "eval.accept.enabled=true"])).objective == Objective.accept_len
    # A run dir written before the objective existed has no such key: it gets the default, tau_sim.
    old = plain([])
    del old["objective"]
    assert validate(old).objective == Objective.tau_sim


def test_objective_value_comes_from_the_best_val_row():
    from eagle3.sweep.objective import objective_value

    best = {"step": 8, "tau_sim": 1.5, "accept_len": 1.25}
    assert objective_value(Objective.tau_sim, best) == 1.5
    assert objective_value(Objective.accept_len, best) == 1.25
    with pytest.raises(ConfigError, match="step 8 has no accept_len"):  # a trial that fails, not a silent 0
        objective_value(Objective.accept_len, {"step": 8, "tau_sim": 1.5, "accept_lossless": False})


def test_sweeper_config_composes_without_importing_optuna():
    cfg = compose_cfg(["hydra/sweeper=optuna"], return_hydra_config=True)
    assert cfg.hydra.sweeper._target_.endswith("OptunaSweeper") and cfg.hydra.sweeper.direction == "maximize"
    with pytest.raises(Exception, match="n_trial"):
        compose_cfg(["hydra/sweeper=optuna", "hydra.sweeper.n_trial=3"], return_hydra_config=True)
    proc = subprocess.run([sys.executable, "-X", "importtime", str(ROOT / "launch.py"), "--cfg", "hydra",
                           "hydra/sweeper=optuna"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "OptunaSweeper" in proc.stdout, proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip().split(".")[0] for line in proc.stderr.splitlines() if "|" in line}
    assert "optuna" not in imported and "torch" not in imported


@pytest.fixture(scope="module")
def study_sweep(cache_dir, tmp_path_factory) -> Path:
    """A 3-trial study of short runs of the tiny default, as a user would run one."""
    sweep = tmp_path_factory.mktemp("study") / "lr_warmup"
    proc = launch(study_command(sweep, 3), cache_dir, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return sweep


@pytest.mark.slow
def test_study_runs_one_job_per_trial_and_continues_in_the_same_study(study_sweep, cache_dir):
    study = load_study(study_sweep)
    trials = study.get_trials()
    assert [t.number for t in trials] == [0, 1, 2] and all(t.state.name == "COMPLETE" for t in trials)
    dirs = run_dirs(study_sweep)
    assert sorted(dirs) == [0, 1, 2]
    for trial in trials:
        run = dirs[trial.number]
        assert Path(trial.user_attrs["run_dir"]) == run
        config = OmegaConf.load(run / "resolved_config.yaml")
        assert config.optim.lr == trial.params["optim.lr"] and 1e-3 <= config.optim.lr <= 1e-2
        assert config.optim.warmup_ratio == trial.params["optim.warmup_ratio"] <= 0.1
        assert config.optim.max_steps == 4  # the fixed overrides reach every trial
        assert trial.value == json.loads((run / "summary.json").read_text())["best"]["tau_sim"]
    for key in ("optim.lr", "optim.warmup_ratio"):
        assert len({t.params[key] for t in trials}) == 3, key
    assert [(j["num"], j["status"]) for j in index_jobs(study_sweep)] == [(n, "completed") for n in range(3)]

    # The same command again: two more trials in the same study, numbered on, in new run dirs.
    proc = launch(study_command(study_sweep, 2), cache_dir, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    trials = load_study(study_sweep).get_trials()
    assert [t.number for t in trials] == list(range(5)) and all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.params["optim.lr"] for t in trials}) == 5
    assert sorted(run_dirs(study_sweep)) == list(range(5))
    assert [(j["num"], j["status"]) for j in index_jobs(study_sweep)] == [(n, "completed") for n in range(5)]

    # Another search space in the same sweep dir is refused, not mixed into the study.
    proc = launch(["-m", "hydra/sweeper=optuna", "optim.lr=tag(log, interval(1e-5, 1e-2))", WARMUP, *SHORT,
                   f"hydra.sweep.dir={study_sweep}"], cache_dir, timeout=300)
    assert proc.returncode != 0 and "search_space" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(load_study(study_sweep).get_trials()) == 5


@pytest.mark.slow
def test_a_failed_trial_is_recorded_and_the_study_goes_on(cache_dir, tmp_path):
    sweep = tmp_path / "study"
    # warmup_ratio >= 1 fails validation. With seed 6, trial 0 samples 1.39 and trial 1 0.83.
    proc = launch(["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=2", "hydra.sweeper.seed=6",
                   "optim.warmup_ratio=interval(0.5, 1.5)", *SHORT, f"hydra.sweep.dir={sweep}"], cache_dir, timeout=900)
    assert proc.returncode != 0
    assert "1 of 2 trials failed" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    trials = load_study(sweep).get_trials()
    states = [(t.state.name, t.params["optim.warmup_ratio"] >= 1) for t in trials]
    assert states == [("FAIL", True), ("COMPLETE", False)], f"{states}: pick a seed whose trial 0 fails, trial 1 not"
    dirs, jobs = run_dirs(sweep), index_jobs(sweep)
    failure = json.loads((dirs[0] / "failure.json").read_text())
    assert "optim.warmup_ratio" in failure["error"] and "optim.warmup_ratio" in trials[0].user_attrs["error"]
    assert (dirs[1] / "summary.json").is_file() and not (dirs[1] / "failure.json").exists()
    assert [(j["num"], j["status"]) for j in jobs] == [(0, "failed"), (1, "completed")]
    assert "optim.warmup_ratio" in jobs[0]["error"]


@pytest.mark.slow
def test_confirm_measures_the_two_best_and_prints_both_rankings(study_sweep, tmp_path):
    def best_tau(run: Path) -> float:
        return json.loads((run / "summary.json").read_text())["best"]["tau_sim"]

    dirs = run_dirs(study_sweep)
    by_tau = sorted(dirs, key=lambda n: (-best_tau(dirs[n]), n))
    png = tmp_path / "study.png"
    proc = run_in_process(["python", "-m", "eagle3.sweep.compare", str(study_sweep), "--confirm", "2", "--plot",
                           str(png)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = {n for n, d in dirs.items() if list(d.glob("accept_k*.json"))}
    assert measured == set(by_tau[:2])
    reports = {n: json.loads((dirs[n] / "accept_k3.json").read_text()) for n in measured}
    assert all(1.0 <= r["accept_len"] <= 4.0 for r in reports.values())
    # The rankings: by tau_sim on the left, by accept_len on the right, over the measured runs.
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("measured acceptance"))
    header, _, *rows = lines[start + 1:]
    assert header.split()[:3] == ["rank", "by", "tau_sim"] and len(rows) == 2
    cells = [row.split() for row in rows]
    assert [c[1] for c in cells] == [f"#{n}" for n in by_tau[:2]]
    by_accept = sorted(measured, key=lambda n: (-reports[n]["accept_len"], by_tau.index(n)))
    assert [c[4] for c in cells] == [f"#{n}" for n in by_accept]
    assert float(cells[0][5]) == pytest.approx(reports[by_accept[0]]["accept_len"], abs=1e-4)

    from matplotlib import image

    pixels = image.imread(png)
    assert pixels.shape[1] > 4 * pixels.shape[0]  # four panels: the study's history is the fourth

    # Again: nothing left to measure among the two best; --confirm 0 only ranks.
    proc = run_in_process(["python", "-m", "eagle3.sweep.compare", str(study_sweep), "--confirm", "2"])
    assert proc.returncode == 0 and "measuring acceptance" not in proc.stderr, proc.stderr
    assert "not measuring" in proc.stderr and "they have a measurement already" in proc.stderr


@pytest.mark.parametrize("override, allowed", [
    ("model.draft.loss=kll", "Error merging override model.draft.loss=kll: Invalid value 'kll', expected one of "
                             "[kl_div, ce, rkl, jsd, tv, nla, lk_hybrid]"),
    ("model.draft.kind=peegle", "expected one of [eagle3, peagle, dflash]"),
    ("data.on_bad_sample=maybe", "expected one of [error, skip]"),
    ("data.prefetch=x", "Value 'x' of type 'str' could not be converted to Integer"),
    ("data=nonsense", "Could not find 'data/nonsense' (options: offline, online, regenerate, tiny)"),
    ("experiment=bad", "In 'experiment/bad': ValidationError raised while composing config: Invalid value 'kll', "
                       "expected one of [kl_div, ce, rkl, jsd, tv, nla, lk_hybrid] (key model.draft.loss)"),
])
def test_a_sweep_job_whose_value_does_not_compose_is_refused_saying_what_is_allowed(tmp_path, override, allowed):
    """The sweeper refuses a sweep with one bad job's value (on the command line or in an option file) in one
    line per job; that line must say what the key takes, as a single run's message does, not only that the
    override did not merge."""
    from hydra_plugins.eagle3_basic_sweeper.sweeper import composition_problem

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "bad.yaml").write_text("# @package _global_\nmodel:\n  draft:\n    loss: kll\n")
    with pytest.raises(Exception) as e:
        compose_cfg([f"hydra.searchpath=[file://{tmp_path}]", override])
    problem = composition_problem(e.value)
    assert allowed in problem and "\n" not in problem


@pytest.mark.slow
def test_a_sweep_with_one_mistyped_enum_value_starts_no_job(tmp_path):
    sweep = tmp_path / "sweep"
    r = launch(["-m", f"hydra.sweep.dir={sweep}", "model.draft.loss=ce,kll", "plan=true"], tmp_path / "cache")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "1 of 2 sweep jobs have an invalid config; no job was started" in r.stderr
    assert "model.draft.loss=kll: Invalid value 'kll', expected one of [kl_div, ce," in r.stderr
    assert not sweep.exists()
