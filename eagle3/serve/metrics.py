"""vLLM's spec-decode counters from its Prometheus /metrics text. They are cumulative: a measurement is the
difference of two scrapes around it.

    vllm:spec_decode_num_drafts                              verify steps that carried a draft
    vllm:spec_decode_num_draft_tokens                        draft tokens proposed (k per draft)
    vllm:spec_decode_num_accepted_tokens                     draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos{position}   accepted at draft position j (0-based)

    vllm:iteration_tokens_total (its _count)                 engine steps (a request's prefill and each verify step)

accept_len = 1 + accepted / drafts (the bonus token counted, the prefill not a draft), as eagle3.eval.measure.
An EAGLE-3 drafter drafts at every verify step; vLLM's n-gram proposer drafts only where the context has a match,
and counts only those steps as drafts, so its 1 + accepted / drafts (what vLLM logs as its mean acceptance length)
leaves out the steps that made one token. Compared with a drafter it is taken over every verify step:
1 + accepted / verify steps, the verify steps being the engine steps less one prefill per request (a prompt within
one prefill step, as the prompts here are).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="([^"]*)"')
PREFIX = "vllm:spec_decode_num_"
STEPS = "vllm:iteration_tokens_total_count"


@dataclass
class SpecCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    steps: int = 0  # engine steps (vllm:iteration_tokens_total's count), with or without a draft

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        n = max(len(self.per_position), len(before.per_position))
        after_, before_ = (padded(c.per_position, n) for c in (self, before))
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted, [a - b for a, b in zip(after_, before_)],
                            self.steps - before.steps)


def padded(values: list[int], n: int) -> list[int]:
    return [*values[:n], *[0] * (n - len(values))]


def spec_counters(text: str) -> SpecCounters:
    """The counters summed over the engines and models a scrape lists (one of each here); zeros when the server
    runs without speculation or has not drafted yet."""
    counters = SpecCounters()
    positions: dict[int, int] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m["name"] == STEPS:
            counters.steps += int(float(m["value"]))
        if not m or not m["name"].startswith(PREFIX) or m["name"].endswith("_created"):
            continue
        what = m["name"][len(PREFIX):].removesuffix("_total")
        value = int(float(m["value"]))
        if what == "drafts":
            counters.drafts += value
        elif what == "draft_tokens":
            counters.draft_tokens += value
        elif what == "accepted_tokens":
            counters.accepted += value
        elif what == "accepted_tokens_per_pos":
            j = int(dict(LABEL.findall(m["labels"] or ""))["position"])
            positions[j] = positions.get(j, 0) + value
    counters.per_position = [positions.get(j, 0) for j in range(max(positions, default=-1) + 1)]
    return counters


def acceptance(c: SpecCounters, k: int) -> dict[str, Any]:
    """accept_len, accept rates per position and the standard error of accept_len (a verify step's accepted
    count n has P(n > j) = per_position[j] / drafts in a chain, which gives its variance)."""
    per_position = padded(c.per_position, k)
    return {"drafts": c.drafts, "draft_tokens": c.draft_tokens, "accepted": c.accepted,
            "accepted_per_position": per_position, **counts_acceptance(c.drafts, per_position)}


def all_steps_acceptance(c: SpecCounters, k: int, requests: int) -> dict[str, Any]:
    """A proposer that drafts only at some steps (n-gram) counted over every verify step (`requests`: how many
    prefills the counters include): accept_len and the rates per position over all of them, beside vLLM's own
    figure over the steps that drafted (`accept_len_drafted`)."""
    per_position = padded(c.per_position, k)
    steps = c.steps - requests if c.steps else None  # None: an engine whose /metrics has no engine-step counter
    return {"verify_steps": steps, "drafts": c.drafts, "draft_tokens": c.draft_tokens, "accepted": c.accepted,
            "accepted_per_position": per_position, **counts_acceptance(max(steps or 0, 0), per_position),
            "accept_len_drafted": 1 + c.accepted / c.drafts if c.drafts else None}


def counts_acceptance(drafts: int, per_position: list[int]) -> dict[str, Any]:
    if drafts == 0:
        return {"accept_len": None, "accept_rate": [None] * len(per_position), "accept_len_se": None}
    tail = [a / drafts for a in per_position]          # P(n > j)
    mean = sum(tail)
    second = sum((2 * j + 1) * p for j, p in enumerate(tail))  # E[n^2] = sum_j (2j+1) P(n > j)
    return {"accept_len": 1.0 + mean, "accept_rate": tail,
            "accept_len_se": (max(second - mean * mean, 0.0) / drafts) ** 0.5}


# --- what a served speedup can be ----------------------------------------------------------------------------------
# A verify step yields accept_len tokens on average and costs at least one plain decoding step, so a speculative
# server is at most accept_len times as fast as plain: a measured speedup above that (speedup > 1 at accept_len 1)
# is the clock's doing, not the drafter's. SPEEDUP_SLACK is the timing noise allowed on top (the servers take turns
# prompt by prompt, so a shared machine's load moves both alike, but not exactly).
SPEEDUP_SLACK = 1.25
# The plain server's tokens/s over its turns of one measurement (each turn the same number of new tokens): a
# larger spread than this factor means the machine's speed moved under the measurement (a shared 2-core machine
# moves by up to 1.7x between minutes), and the speedup measured through it is not a result.
PLAIN_DRIFT = 2.5


def implausible(speedups: dict[str, float], accept_len: float | None, plain_tokens_per_s: list[float],
                reference_plain: float | None = None) -> list[str]:
    """Why a measurement is not a result (empty: nothing found). `speedups`: the speedups measured ({"speedup":
    ..., "speedup_median": ...}); `plain_tokens_per_s`: the plain server's per turn; `reference_plain`: its tokens/s
    in an earlier measurement of the same command (same server, same prompts), if any."""
    reasons = []
    bound = (accept_len or 1.0) * SPEEDUP_SLACK
    for name, value in speedups.items():
        if value > bound:
            reasons.append(f"{name} {value:.3f} is above what accept_len {accept_len or 1.0:.4f} allows (a verify "
                           f"step yields accept_len tokens and costs at least a plain step: at most "
                           f"{accept_len or 1.0:.4f} x {SPEEDUP_SLACK:g} for timing noise = {bound:.3f})")
    if plain_tokens_per_s:
        low, high = min(plain_tokens_per_s), max(plain_tokens_per_s)
        if low <= 0 or high / low > PLAIN_DRIFT:
            reasons.append(f"the plain server's tokens/s moved from {low:.1f} to {high:.1f} between its turns "
                           f"(more than {PLAIN_DRIFT:g}x): the machine's speed changed under the measurement")
        mean = len(plain_tokens_per_s) / sum(1 / r for r in plain_tokens_per_s) if low > 0 else 0.0  # all turns
        if reference_plain and mean > 0 and max(mean / reference_plain, reference_plain / mean) > PLAIN_DRIFT:
            reasons.append(f"the plain server made {mean:.1f} tokens/s here and {reference_plain:.1f} in this "
                           f"command's first measurement (more than {PLAIN_DRIFT:g}x apart)")
    return reasons
