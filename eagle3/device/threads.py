"""torch's CPU threads, set for a while."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """torch's CPU threads set to `n` for a while (None: unchanged). The measurement is many small sequential
    forwards: on a small model a second thread gains little, and when another process busies the cores its
    spinning threads make each forward tens of times slower (measured 9 ms -> 450 ms on 2 shared cores)."""
    before = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
