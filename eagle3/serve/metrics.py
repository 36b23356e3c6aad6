"""vLLM's spec-decode counters from its Prometheus /metrics text. They are cumulative: a measurement is the
difference of two scrapes around it.

    vllm:spec_decode_num_drafts                              verify steps that carried a draft
    vllm:spec_decode_num_draft_tokens                        draft tokens proposed (k per draft)
    vllm:spec_decode_num_accepted_tokens                     draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos{position}   accepted at draft position j (0-based)

accept_len = 1 + accepted / drafts (the bonus token counted, the prefill not a draft), as eagle3.eval.measure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
LABEL = re.compile(r'(\w+)="([^"]*)"')
PREFIX = "vllm:spec_decode_num_"


@dataclass
class SpecCounters:
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)

    def __sub__(self, before: SpecCounters) -> SpecCounters:
        n = max(len(self.per_position), len(before.per_position))
        after_, before_ = (padded(c.per_position, n) for c in (self, before))
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted, [a - b for a, b in zip(after_, before_)])


def padded(values: list[int], n: int) -> list[int]:
    return [*values[:n], *[0] * (n - len(values))]


def spec_counters(text: str) -> SpecCounters:
    """The counters summed over the engines and models a scrape lists (one of each here); zeros when the server
    runs without speculation or has not drafted yet."""
    counters = SpecCounters()
    positions: dict[int, int] = {}
    for line in text.splitlines():
        m = SAMPLE.match(line)
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


def counts_acceptance(drafts: int, per_position: list[int]) -> dict[str, Any]:
    if drafts == 0:
        return {"accept_len": None, "accept_rate": [None] * len(per_position), "accept_len_se": None}
    tail = [a / drafts for a in per_position]          # P(n > j)
    mean = sum(tail)
    second = sum((2 * j + 1) * p for j, p in enumerate(tail))  # E[n^2] = sum_j (2j+1) P(n > j)
    return {"accept_len": 1.0 + mean, "accept_rate": tail,
            "accept_len_se": (max(second - mean * mean, 0.0) / drafts) ** 0.5}
