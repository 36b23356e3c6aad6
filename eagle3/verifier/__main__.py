"""`python -m eagle3.verifier ARGS`, the older path of `eagle3 verifier ARGS` (eagle3/cli/verifier.py)."""

import runpy
import sys

if __name__ == "__main__":
    sys.argv[0:1] = ["eagle3", "verifier"]
    runpy.run_module("eagle3.cli", run_name="__main__")
