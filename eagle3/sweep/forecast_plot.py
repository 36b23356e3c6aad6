"""The forecast's picture: each run's val points (mapped to accept_len), the fitted curve with its 90% band, the
points after --until, the target and n-gram lines; tokens on a log scale."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(reports: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    lines_drawn: set[tuple[str, float]] = set()
    for r in reports:
        pts = [p for p in r["points"] if p["tokens"] > 0]
        ratio = r["ratio"]["value"]
        shown = [p["accept_len"] if p["accept_len"] is not None else ratio * p["tau_sim"] for p in pts]
        dots = ax.plot([p["tokens"] for p in pts], shown, "o", label=f"{r['label']}: points used")[0]
        band = r["band"]
        ax.plot([b["tokens"] for b in band], [b["accept_len"] for b in band], "-", color=dots.get_color(),
                label=f"{r['label']}: fit, {r['curve']['form']}")
        ax.fill_between([b["tokens"] for b in band], [b["low"] for b in band], [b["high"] for b in band],
                        color=dots.get_color(), alpha=0.15, label=f"{r['label']}: 90% band")
        later = [p for p in r["later"] if p["tokens"] > 0]
        if later:
            ax.plot([p["tokens"] for p in later],
                    [p["accept_len"] if p["accept_len"] is not None else ratio * p["tau_sim"] for p in later],
                    "x", color=dots.get_color(), label=f"{r['label']}: after --until (not used)")
        for goal in r["reach"]:
            if (goal["name"], goal["accept_len"]) not in lines_drawn:
                lines_drawn.add((goal["name"], goal["accept_len"]))
                ax.axhline(goal["accept_len"], linestyle="--", color="gray" if goal["name"] == "n-gram" else "red",
                           label=f"{goal['name']} {goal['accept_len']:.3f}")
    ax.set_xscale("log")
    ax.set_xlabel("tokens trained")
    ax.set_ylabel("accept_len")
    ax.set_title("acceptance forecast")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    from eagle3.safe_write import replace_file

    replace_file(out.parent, out, lambda tmp: fig.savefig(tmp, dpi=110, format=out.suffix.lower()[1:]))
    plt.close(fig)
