"""A forecast written into the run's own wandb run, after the run: the run id eagle3.train.track kept in
`<run_dir>/wandb_run_id`, resumed in the mode the run logged in (offline: a new offline segment in the run's wandb
dir, `wandb sync` uploads it with the rest), with the forecast as summary values (`forecast/...`) and the fitted
curve with its band as a table and line chart (`forecast/curve`). A run that logged nothing to wandb is left alone.
"""

from __future__ import annotations

import os
from typing import Any

from eagle3.sweep.forecast import RunLike


def summary_values(report: dict[str, Any]) -> dict[str, float | int | bool | None]:
    """The forecast's numbers, flat, as wandb summary keys."""
    out: dict[str, float | int | bool | None] = {
        "forecast/tokens_so_far": report["tokens_so_far"], "forecast/step": report["step"],
        "forecast/asymptote_accept_len": report["curve"]["asymptote_accept_len"],
        "forecast/ratio": report["ratio"]["value"]}
    for a in report["at"]:
        multiple = a["tokens"] / report["tokens_so_far"]
        name = f"{multiple:g}x" if abs(multiple - round(multiple)) < 1e-9 else f"{a['tokens']:.3g}"
        for key in ("accept_len", "low", "high"):
            out[f"forecast/accept_len@{name}" + ("" if key == "accept_len" else f"_{key}")] = a[key]
    for goal in report["reach"]:
        name = goal["name"].replace("-", "")
        out[f"forecast/tokens_to_{name}"] = goal["tokens"] if goal["within"] else None
        out[f"forecast/within_{name}"] = goal["within"]
        if "hours" in goal:
            out[f"forecast/hours_to_{name}"] = goal["hours"] if goal["within"] else None
    return out


def log_forecast(run: RunLike, report: dict[str, Any]) -> str:
    """Writes the forecast into the run's wandb run; returns what was done, for the console."""
    mode = run.config.get("logger.mode")
    id_file = run.path / "wandb_run_id"
    if mode in (None, "disabled") or not id_file.is_file():
        return "no wandb run (logger.mode=disabled or no wandb_run_id): nothing logged"
    import wandb

    os.environ.setdefault("WANDB_SILENT", "true")
    try:
        wb = wandb.init(id=id_file.read_text().strip(), resume="allow", mode=mode, dir=str(run.path),
                        project=run.config.get("logger.project"), entity=run.config.get("logger.entity"))
    except (wandb.errors.CommError, wandb.errors.UsageError) as e:
        return f"wandb could not resume the run ({e}); nothing logged (try logger.mode=offline's files)"
    try:
        for key, value in summary_values(report).items():
            wb.summary[key] = value
        table = wandb.Table(columns=["tokens", "accept_len", "low", "high"],
                            data=[[a["tokens"], a["accept_len"], a["low"], a["high"]] for a in report["at"]])
        wb.log({"forecast/curve": wandb.plot.line(table, "tokens", "accept_len", title="forecast accept_len")})
    finally:
        wb.finish()
    return f"forecast logged to wandb run {id_file.read_text().strip()} ({mode})"
