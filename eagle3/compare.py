"""The old path of eagle3.sweep.compare (moved into its subpackage): `python -m eagle3.compare` says where it went."""

import shlex
import sys

if __name__ == "__main__":
    new = f"python -m eagle3.sweep.compare {shlex.join(sys.argv[1:])}".rstrip()
    sys.exit(f"error: eagle3.compare moved to eagle3.sweep.compare: {new}")
