"""The old path of eagle3.serve.export (moved into its subpackage): `python -m eagle3.export` says where it went."""

import shlex
import sys

if __name__ == "__main__":
    new = f"python -m eagle3.serve.export {shlex.join(sys.argv[1:])}".rstrip()
    sys.exit(f"error: eagle3.export moved to eagle3.serve.export: {new}")
