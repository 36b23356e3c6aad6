"""Verifiers as a user has them, made into a local Hugging Face causal LM dir that eagle3 trains against.

    python -m eagle3.verifier from-gguf FILE OUT     # a GGUF file (llama.cpp) -> an fp32 safetensors dir + tokenizer

from-gguf: transformers de-quantizes the GGUF file's tensors (the `gguf` and `accelerate` packages), and the model is
written as fp32 safetensors with the tokenizer and the chat template the file holds, into OUT (a new directory:
an existing one is never overwritten; a conversion that fails leaves nothing behind). Then:

    python launch.py model=auto model.verifier.path=OUT data=online data.path=rows.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eagle3.verifier", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gguf = commands.add_parser("from-gguf", help="a GGUF file -> an fp32 safetensors dir with its tokenizer",
                               description="Convert a GGUF file (llama.cpp's format) into an fp32 safetensors "
                                           "Hugging Face dir with its tokenizer and chat template.")
    gguf.add_argument("file", metavar="FILE", help="the .gguf file")
    gguf.add_argument("out", metavar="OUT", help="the directory to write (must not exist)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from eagle3.errors import UserError
    from eagle3.verifier.gguf import from_gguf

    try:
        out = from_gguf(Path(args.file), Path(args.out))
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        from eagle3.console import interrupted

        raise interrupted("interrupted (Ctrl-C): nothing was written") from None
    print(out)


if __name__ == "__main__":
    main(sys.argv[1:])
