"""The old path of `eagle3 compare` (before the move into subpackages and the verbs): `python -m eagle3.compare`
says what to run instead."""

import shlex
import sys

if __name__ == "__main__":
    new = f"eagle3 compare {shlex.join(sys.argv[1:])}".rstrip()
    sys.exit(f"error: eagle3.compare moved; the command is now: {new}")
