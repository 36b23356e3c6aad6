"""The plot of `eagle3 compare --plot`: val tau_sim and loss against step for every run, the best run's per-position
accuracy, and the history of the Optuna study the sweep dir holds (sweeps made with hydra/sweeper=optuna)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from eagle3.errors import DataError
from eagle3.sweep.compare import _fmt, differing_keys, rank
from eagle3.sweep.runs import Run
from eagle3.sweep.study import STUDY_FILE  # hydra_plugins/eagle3_optuna_sweeper keeps the study there, in the sweep dir


def plot(runs: list[Run], out: Path, history: StudyHistory | None = None) -> None:
    """Val tau_sim and val loss against step for every run; per-position accuracy of the best run; the
    study's objective by trial, if the sweep was an Optuna study."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = differing_keys(runs)
    evaluated = [r for r in rank(runs) if r.val_rows]
    if not evaluated:
        raise DataError("no run has val rows to plot")
    fig, axes = plt.subplots(1, 3 + (history is not None), figsize=(17 + 5.5 * (history is not None), 5))
    for run in evaluated:
        name = ", ".join(f"{k.split('.')[-1]}={_fmt(run.config.get(k))}" for k in keys) or run.label
        steps = [r["step"] for r in run.val_rows]
        axes[0].plot(steps, [r["tau_sim"] for r in run.val_rows], marker="o", label=name)
        axes[1].plot(steps, [r["loss"] for r in run.val_rows], marker="o", label=name)
    best = evaluated[0]
    positions = sorted(int(k.rsplit("_", 1)[1]) for k in best.val_rows[0] if k.startswith("full_acc_"))
    for k in positions:
        steps = [r["step"] for r in best.val_rows]
        axes[2].plot(steps, [r[f"full_acc_{k}"] for r in best.val_rows], marker="o", label=f"full_acc_{k}")
        axes[2].plot(steps, [r[f"cond_acc_{k}"] for r in best.val_rows], linestyle="--", label=f"cond_acc_{k}")
    titles = ["val tau_sim (simulated acceptance length)", "val loss",
              f"per-position val accuracy, best run {best.label}"]
    ylabels = ["tau_sim", "loss", "accuracy"]
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if history is not None:
        plot_history(axes[3], history)
    fig.tight_layout()
    from eagle3.safe_write import replace_file

    # whole, and never through a link at `out`
    replace_file(out.parent, out, lambda tmp: fig.savefig(tmp, dpi=110, format=out.suffix.lower()[1:]))
    plt.close(fig)



# --- an Optuna study's history (sweeps made with hydra/sweeper=optuna) ------------------------------------------


@dataclass
class StudyHistory:
    objective: str
    direction: str
    trials: list[tuple[int, str, float | None]]   # (number, state, value) in trial order


def study_history(paths: list[Path]) -> StudyHistory | None:
    """The trials of the Optuna study in the one sweep dir given, if it holds one (optuna imported only then)."""
    files = [p / STUDY_FILE for p in paths if (p / STUDY_FILE).is_file()]
    if len(files) != 1 or len(paths) != 1:
        return None
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{files[0].resolve()}"
    names = optuna.get_all_study_names(storage)
    if len(names) != 1:
        return None
    study = optuna.load_study(study_name=names[0], storage=storage)
    trials = [(t.number, t.state.name, t.value) for t in study.get_trials(deepcopy=False)]
    return StudyHistory(study.user_attrs.get("objective") or "objective", study.direction.name.lower(), trials)


def best_so_far(history: StudyHistory) -> list[tuple[int, float]]:
    """(trial number, best value among the completed trials up to it) at each completed trial."""
    better = max if history.direction == "maximize" else min
    out: list[tuple[int, float]] = []
    for number, state, value in history.trials:
        if state == "COMPLETE" and value is not None:
            out.append((number, value if not out else better(out[-1][1], value)))
    return out


def plot_history(ax, history: StudyHistory) -> None:
    done = [(n, v) for n, s, v in history.trials if s == "COMPLETE" and v is not None]
    failed = [n for n, s, _ in history.trials if s == "FAIL"]
    if done:
        ax.plot(*zip(*done), "o", label=f"trial {history.objective}")
        ax.step(*zip(*best_so_far(history)), where="post", label="best so far")
    if failed:
        low = min((v for _, v in done), default=0.0)
        ax.plot(failed, [low] * len(failed), "x", color="red", label="failed")
    ax.set_title(f"Optuna study: {history.objective} by trial ({history.direction})")
    ax.set_xlabel("trial")
    ax.set_ylabel(history.objective)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
