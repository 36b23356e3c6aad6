"""A forecast (eagle3.sweep.forecast's report dict) as text: one block per run, a ranking of several."""

from __future__ import annotations

from typing import Any

from eagle3.sweep.forecast import tokens_text


def band_text(low: float | None, high: float | None, fmt: str = "{:.3f}") -> str:
    return f"[{fmt.format(low) if low is not None else 'never'}, {fmt.format(high) if high is not None else 'never'}]"


def hours_text(hours: float | None) -> str:
    if hours is None:
        return "never"
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"


def format_report(r: dict[str, Any]) -> str:
    """The forecast of one run, as a user reads it."""
    curve, ratio = r["curve"], r["ratio"]
    last = r["points"][-1]
    mapped = (f"accept_len = {ratio['value']:.3f} x tau_sim (the mean ratio at {ratio['measured_points']} measured "
              f"checkpoints: {', '.join(ratio['sources'])})" if ratio["measured_points"] else
              "no checkpoint of it measured: accept_len is read as tau_sim (teacher-forced, usually above what "
              "serving accepts; measure with eagle3 accept --run RUN)")
    lines = [f"run {r['label']} ({r['run']}): {len(r['points'])} val passes up to step {r['step']} "
             f"({tokens_text(r['tokens_so_far'])} tokens, {r['until']}), tau_sim {last['tau_sim']:.4f}",
             f"  fit: {curve['form']}, a={curve['a']:.3f} b={curve['b']:.3f} c={curve['c']:.3f} "
             f"t_ref={tokens_text(curve['t_ref'])}, rms {curve['rms']:.4f}; {mapped}",
             f"  asymptote: accept_len {curve['asymptote_accept_len']:.3f} "
             f"{band_text(*curve['asymptote_band'])}"
             + (f" (at the ceiling, 1 + k = {r['k'] + 1}: the points do not bend yet, so the asymptote is not known "
                "from them; the curve is read as a straight line in log-tokens)" if curve["asymptote_at_ceiling"]
                else "")]
    if r.get("schedule"):
        lines.append("  " + schedule_text(r))
    speedup = r["speedup_costs"] is not None
    lines.append((f"  {'tokens':>10}  {'accept_len':>10}  {'90% interval':<17}"
                  + ("  pred. speedup" if speedup else "")).rstrip())
    end = r.get("planned_end")
    for a in r["at"]:
        band = band_text(a["low"], a["high"])
        lines.append((f"  {tokens_text(a['tokens']):>10}  {a['accept_len']:>10.3f}  {band:<17}"
                     + (f"  {a['speedup']:.3f}x" if speedup else "")
                     + (f"  the planned run's end (step {end['steps']})" if end and a["tokens"] == end["tokens"]
                        else "")).rstrip())
    for goal in r["reach"]:
        lines.append("  " + goal_text(goal, r))
    if speedup:
        lines.append(f"  speedup: eagle3 speedup's model at {r['speedup_costs']}")
    later = [p for p in r["later"] if p["tokens"] > 0]
    if later:
        end = later[-1]
        measured = f", measured accept_len {end['accept_len']:.3f}" if end["accept_len"] is not None else ""
        lines.append(f"  after --until: step {end['step']} ({tokens_text(end['tokens'])} tokens) reached tau_sim "
                     f"{end['tau_sim']:.4f}{measured}; forecast {end['fitted_accept_len']:.3f}")
    return "\n".join(lines)


def schedule_text(r: dict[str, Any]) -> str:
    """The schedule line: what the forecast knows of the lr to come, and what the anneal adds."""
    s, curve = r["schedule"], r["curve"]
    low, high = s["gain_band"]
    return (f"schedule: {s['kind']} over {s['total_steps']} steps ({s['source']}; {tokens_text(s['planned_tokens'])} "
            f"tokens), warmup {s['warmup_ratio']:g}: t counts tokens x lr / peak; a full anneal adds "
            f"{curve['gain']:+.3f} tau_sim [{low:+.3f}, {high:+.3f}] (r={curve['r']:.2f} x the slope per e-fold; "
            f"prior {s['anneal_prior'][0]:g} +- {s['anneal_prior'][1]:g}); beyond the planned end: the end of a "
            "longer run of this recipe")


def goal_text(goal: dict[str, Any], r: dict[str, Any]) -> str:
    what = f"{goal['name']} {goal['accept_len']:.3f} ({goal['source']})"
    if "reached_at_step" in goal:
        return f"{what}: reached at step {goal['reached_at_step']} ({tokens_text(goal['tokens'])} tokens)"
    if not goal["within"]:
        why = (f"the fitted asymptote {r['curve']['asymptote_accept_len']:.3f} stays below it" if goal["never"] else
               f"the fit crosses at {tokens_text(goal['tokens'])}")
        return (f"{what}: not within {tokens_text(r['horizon_tokens'])} tokens ({why}; 90% interval "
                f"{band_text(goal['low'], goal['high'], '{:.3g}')} tokens)")
    text = (f"{what}: at {tokens_text(goal['tokens'])} tokens "
            f"[{tokens_text(goal['low'])}, {tokens_text(goal['high'])}]")
    if "hours" in goal:
        text += (f", {hours_text(goal['hours'])} more at {goal['tokens_per_s']:.0f} tokens/s "
                 f"[{hours_text(goal['hours_low'])}, {hours_text(goal['hours_high'])}]")
    if "speedup" in goal:
        text += f", predicted speedup {goal['speedup']:.3f}x"
    return text


def ranking_text(reports: list[dict[str, Any]]) -> str:
    """Runs side by side in the order given (eagle3.sweep.forecast.rank_reports)."""
    goal = reports[0]["reach"][0]["name"] if reports[0]["reach"] else None
    by_end = all(r.get("planned_end") for r in reports)
    header = ["rank", "run", "tokens so far", *(["planned end"] if by_end else []), "accept_len@10x", "asymptote"]
    if goal:
        header.append(f"tokens to {goal}")
    rows = [header]
    for i, r in enumerate(reports, 1):
        at10 = max((a for a in r["at"] if a["tokens"] <= 10.0001 * r["tokens_so_far"]), key=lambda a: a["tokens"])
        end = r.get("planned_end") or {}
        cells = [str(i), r["label"], tokens_text(r["tokens_so_far"]),
                 *([f"{end['accept_len']:.3f} at {tokens_text(end['tokens'])}"] if by_end else []),
                 f"{at10['accept_len']:.3f}", f"{r['curve']['asymptote_accept_len']:.3f}"]
        if goal:
            g = r["reach"][0] if r["reach"] else None
            cells.append("-" if g is None else tokens_text(g["tokens"]) if g["within"] else
                         f"> {tokens_text(r['horizon_tokens'])}")
        rows.append(cells)
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
