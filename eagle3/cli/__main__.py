"""`eagle3 VERB ARGS`: the verb's module is imported only when it runs, so `eagle3 --help` imports none of them and
`eagle3 VERB --help` only its own parser (no torch)."""

from __future__ import annotations

import importlib
import sys

from eagle3.cli.verbs import available

USAGE = "usage: eagle3 VERB [ARGS ...]   (eagle3 VERB --help: the verb's own options)"


def help_text() -> str:
    verbs = available()
    width = max(len(v) for v in verbs)
    lines = [USAGE, "", "Train EAGLE-3 draft models and measure them. Verbs:"]
    lines += [f"  {verb:<{width}}  {help_line}" for verb, (_, help_line) in verbs.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        print(help_text(), file=sys.stderr)
        return 2
    if args[0] in ("-h", "--help", "help"):
        print(help_text())
        return 0
    verbs = available()
    if args[0] not in verbs:
        print(f"{USAGE}\neagle3: error: no verb {args[0]!r}; the verbs: {', '.join(verbs)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"eagle3.cli.{verbs[args[0]][0]}")
    return module.main(args[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
