"""Signals that raise while a block runs: the one way this package turns SIGTERM, Ctrl-C or SIGHUP into an exception
at the point the main thread is at, so the `finally` and `with` blocks on the way out run as they do for an error.
Imports nothing heavy: the sweeper plugins and the serving CLI use it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager


@contextmanager
def raising_on(signals: Iterable[int], exception: Callable[[int], BaseException]) -> Iterator[None]:
    """While the block runs, each of `signals` raises `exception(signum)` in the main thread (the handler may log
    first); the handlers before it are back afterwards. Outside the main thread, where no handler can be set, the
    block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handle(signum: int, frame: object) -> None:
        raise exception(signum)

    previous = {s: signal.signal(s, handle) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
