"""`eagle3 plan [OVERRIDES ...]`: the run's memory (GiB per rank) and time plan, nothing built or written: `eagle3
train plan=true OVERRIDES`. Exit status 0 when it fits, 3 when it does not, 1 for a refused config."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from eagle3.cli.train import main as train

    return train(["plan=true", *(sys.argv[1:] if argv is None else argv)])
