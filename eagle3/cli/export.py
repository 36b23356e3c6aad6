"""`eagle3 export CHECKPOINT --out DIR`: export a checkpoint for a serving engine, checked before anything is
written (eagle3/serve/export.py says what is checked and how each layout differs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle3.cli.tail import finish


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle3 export", description="Export a checkpoint for a serving engine.")
    parser.add_argument("checkpoint", type=Path, help="a checkpoint dir, e.g. <run_dir>/checkpoints/best")
    parser.add_argument("--format", choices=["speculators", "specforge"], default="speculators")
    parser.add_argument("--out", type=Path, required=True, help="an empty or new directory")
    parser.add_argument("--verifier", help="the verifier vLLM will load (hub id or path), written into the "
                                           "speculators config; a local dir is also read to check the export")
    args = parser.parse_args(argv)
    if args.verifier is not None and not args.verifier.strip():
        # An empty name would be written as the verifier vLLM loads, or silently dropped: neither is what was asked.
        parser.error(f"--verifier {args.verifier!r} names no verifier; give the hub id or path vLLM will load, or "
                     f"leave the option out to keep the checkpoint's")

    def export() -> int:
        from eagle3.serve.export import export

        for warning in export(args.checkpoint, args.out, args.format, args.verifier):
            print(f"warning: {warning}", file=sys.stderr)
        print(f"wrote {args.format} checkpoint to {args.out}")
        return 0

    return finish(export)
