"""The old path of `eagle3 export` (before the move into subpackages and the verbs): `python -m eagle3.export`
says what to run instead."""

import shlex
import sys

if __name__ == "__main__":
    new = f"eagle3 export {shlex.join(sys.argv[1:])}".rstrip()
    sys.exit(f"error: eagle3.export moved; the command is now: {new}")
