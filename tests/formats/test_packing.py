"""The packing of a split into micro-batches and steps (eagle3/formats/packing.py): every row in exactly one
micro-batch of every epoch, no micro-batch over its positions, the same count of steps for every seed and epoch,
and nearly full micro-batches on chat-like lengths."""

from __future__ import annotations

import numpy as np

from eagle3.formats.packing import epoch_packs, sizes, steps_per_epoch


def random_lengths(rng: np.random.Generator, t: int) -> np.ndarray:
    """Rows of every kind a split holds: 1-token rows, short ones, ones that fill a micro-batch and ones cut at T."""
    n = int(rng.integers(1, 60))
    kind = rng.integers(4)
    if kind == 0:
        return rng.integers(1, 2 * t + 3, n)
    if kind == 1:
        return np.full(n, int(rng.integers(1, t + 3)))
    if kind == 2:
        return rng.choice([1, 2, t // 2, t // 2 + 2, t + 1, 3 * t], n)
    return rng.integers(t // 2 + 2, t + 2, n)  # every row alone in its micro-batch


def chat_like_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Token counts shaped as SmolLM2's tokens of ShareGPT conversations under 4,000 characters (mean about 550,
    median about 520, 6% over 1,024; bench/packing.py measures the file itself)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(6.23, 0.45, n), 8, 2700).astype(np.int64)


def test_every_row_is_in_exactly_one_micro_batch_of_every_epoch_and_none_overflows():
    rng = np.random.default_rng(0)
    for case in range(120):
        t = int(rng.choice([8, 16, 64, 100]))
        lengths, replicas, seed = random_lengths(rng, t), int(rng.integers(1, 9)), int(rng.integers(0, 10_000))
        steps = steps_per_epoch(lengths, t, replicas)
        for epoch in range(3):
            packs = epoch_packs(lengths, t, replicas, seed, epoch)
            assert len(packs) == steps * replicas, case
            assert sorted(i for p in packs for i in p) == list(range(len(lengths))), case
            assert all(sizes(lengths, t)[p].sum() <= t for p in packs), case
            # Empty micro-batches only where no micro-batch holds two rows to split, and never a whole step.
            if any(not p for p in packs):
                assert all(len(p) <= 1 for p in packs) and len(lengths) < len(packs), case
            assert all(any(packs[s * replicas:(s + 1) * replicas]) for s in range(steps)), case


def test_the_count_of_steps_is_the_same_for_every_seed_and_epoch_and_the_draw_still_varies_the_packs():
    lengths = chat_like_lengths(300)
    counts, orders = set(), set()
    for seed in range(4):
        for epoch in range(4):
            packs = epoch_packs(lengths, 1024, 3, seed, epoch)
            counts.add(len(packs))
            orders.add(tuple(tuple(p) for p in packs))
    assert counts == {3 * steps_per_epoch(lengths, 1024, 3)}
    assert len(orders) == 16


def test_a_count_short_of_the_replicas_is_made_up_by_splitting_the_fullest_packs():
    # Five 2-position rows fit one pack of 16; three replicas: the pack is split into three.
    packs = epoch_packs([3] * 5, 16, 3, seed=0, epoch=0)
    assert sorted(len(p) for p in packs) == [1, 2, 2]
    # Two rows that cannot share a pack, three replicas: the last micro-batch of the step is empty.
    packs = epoch_packs([15, 15], 16, 3, seed=0, epoch=0)
    assert sorted(len(p) for p in packs) == [0, 1, 1]


def test_best_fit_decreasing_fills_chat_like_rows():
    """speculators' packing fills 75% of these micro-batches (bench/packing.py prints both)."""
    lengths, t = chat_like_lengths(400), 1024
    for replicas in (1, 2, 4):
        fill = sizes(lengths, t).sum() / (steps_per_epoch(lengths, t, replicas) * replicas * t)
        assert fill >= 0.95, (replicas, fill)
