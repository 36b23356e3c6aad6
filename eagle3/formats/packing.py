"""Which rows go into which packed micro-batch, and in which step: the packing of a split (pure numpy, no torch).

A row of n tokens takes n - 1 positions of a micro-batch of T positions (the EAGLE-3 shift; eagle3/data/reader.py
lays them out), a row longer than T + 1 tokens is cut at T positions. Rows are packed by best-fit decreasing over
these sizes: the rows in decreasing size, equal sizes in an order drawn from (seed, epoch), each into the fullest
pack it still fits, a new one when none has room. Best fit decreasing fills 98-99% of the positions on ShareGPT's
length distribution at T = 1,024-3,072, where speculators' MultipackDistributedBatchSamplerV2 (a binary search for
the longest run of the shuffled rows that fits the replicas) fills 75-90% (bench/packing.py).

Its count of packs depends only on the rows' sizes, never on the seed or the epoch (the draw orders rows of equal
size, which are interchangeable), so every epoch has the same number of steps, known before the first one:
`steps_per_epoch` is the one count that the schedule, the loop's cadence, resume and the plan ask.

An epoch's packs, in step order (`epoch_packs`): a step takes `replicas` (world size x grad_accum) micro-batches.
The packs are shuffled (the same draw); when their count is not a multiple of `replicas`, the packs holding the
most rows are split in two (into halves of about equal size) until it is; only when every pack holds one row and
the count still falls short do empty micro-batches (no row: all padding, no loss, no token counted) fill the last
step. Every row of the split is in exactly one micro-batch of every epoch.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np


def sizes(lengths: Sequence[int] | np.ndarray, total_seq_len: int) -> np.ndarray:
    """Positions each row takes in a micro-batch of `total_seq_len`: n - 1 for n tokens, at most total_seq_len."""
    return np.clip(np.asarray(lengths, dtype=np.int64) - 1, 0, total_seq_len)


def best_fit_decreasing(row_sizes: np.ndarray, capacity: int,
                        rng: np.random.Generator | None = None) -> list[list[int]]:
    """Packs of row indices, each holding at most `capacity` positions, by best-fit decreasing; `rng` orders the rows
    of equal size (None: by index). The packs' shapes (their rows' sizes) do not depend on that order."""
    ties = np.arange(len(row_sizes)) if rng is None else rng.permutation(len(row_sizes))
    order = np.lexsort((ties, -row_sizes))
    packs: list[list[int]] = []
    by_room: dict[int, list[int]] = {}  # room left -> packs with that room (the last one filled first)
    rooms: list[int] = []               # the rooms that some pack has, ascending
    for i in order.tolist():
        size = int(row_sizes[i])
        k = bisect.bisect_left(rooms, size)
        if k == len(rooms):
            pack, room = len(packs), capacity
            packs.append([])
        else:
            room = rooms[k]
            pack = by_room[room].pop()
            if not by_room[room]:
                del by_room[room], rooms[k]
        packs[pack].append(i)
        left = room - size
        if left not in by_room:
            by_room[left] = []
            bisect.insort(rooms, left)
        by_room[left].append(pack)
    return packs


def steps_per_epoch(lengths: Sequence[int] | np.ndarray, total_seq_len: int, replicas: int) -> int:
    """Optimizer steps in every epoch of rows of `lengths`, `replicas` micro-batches of `total_seq_len` each."""
    if not len(lengths):
        return 0
    return -(-len(best_fit_decreasing(sizes(lengths, total_seq_len), total_seq_len)) // replicas)


def epoch_packs(lengths: Sequence[int] | np.ndarray, total_seq_len: int, replicas: int, seed: int,
                epoch: int) -> list[list[int]]:
    """Every micro-batch of `epoch` (row indices into `lengths`), in step order: step s is packs
    [s * replicas, (s + 1) * replicas); steps_per_epoch(...) * replicas of them, every row in exactly one."""
    rng = np.random.default_rng([seed, epoch])
    row_sizes = sizes(lengths, total_seq_len)
    packs = best_fit_decreasing(row_sizes, total_seq_len, rng)
    packs = [packs[i] for i in rng.permutation(len(packs))]
    wanted = steps_per_epoch(lengths, total_seq_len, replicas) * replicas
    while len(packs) < wanted:
        most = max(range(len(packs)), key=lambda p: len(packs[p]))  # the first of those holding the most rows
        if len(packs[most]) < 2:
            packs += [[] for _ in range(wanted - len(packs))]
            break
        packs[most], half = halves(packs[most], row_sizes)
        packs.append(half)
    return packs


def halves(pack: list[int], row_sizes: np.ndarray) -> tuple[list[int], list[int]]:
    """A pack of two rows or more split in two of about equal size: each row, largest first, to the smaller half."""
    parts: tuple[list[int], list[int]] = ([], [])
    filled = [0, 0]
    for i in sorted(pack, key=lambda i: -int(row_sizes[i])):
        side = 0 if (filled[0], len(parts[0])) <= (filled[1], len(parts[1])) else 1
        parts[side].append(i)
        filled[side] += int(row_sizes[i])
    return parts
