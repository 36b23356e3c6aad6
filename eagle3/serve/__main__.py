"""`python -m eagle3.serve ARGS`, the older path of `eagle3 serve ARGS` (eagle3/cli/serve.py)."""

import runpy
import sys

if __name__ == "__main__":
    sys.argv[0:1] = ["eagle3", "serve"]
    runpy.run_module("eagle3.cli", run_name="__main__")
