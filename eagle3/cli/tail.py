"""The one ending every verb shares: a UserError is one message, `error: <message>`, and exit status 1 (no
traceback); Ctrl-C is what was kept and exit status 130; anything else is a bug and keeps its traceback."""

from __future__ import annotations

import sys
from collections.abc import Callable

from eagle3.errors import UserError

INTERRUPTED_STATUS = 130  # 128 + SIGINT, as a shell reports a process Ctrl-C ended


def finish(body: Callable[[], int | None], interrupted: str = "interrupted") -> int:
    """`body`'s exit status (None: 0). A UserError ends the command as `raise SystemExit("error: ...")` does (the
    interpreter prints the message on stderr and exits 1; a test in the same process reads it off the exception);
    Ctrl-C prints `interrupted` on stderr and exits INTERRUPTED_STATUS."""
    try:
        return body() or 0
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        print(interrupted, file=sys.stderr)
        raise SystemExit(INTERRUPTED_STATUS) from None
