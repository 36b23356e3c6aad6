"""`eagle3 verifier`: verifiers as a user has them, made into a local Hugging Face causal LM dir that eagle3 trains
against.

    eagle3 verifier from-gguf FILE OUT     # a GGUF file (llama.cpp) -> an fp32 safetensors dir + tokenizer

from-gguf: transformers de-quantizes the GGUF file's tensors (the `gguf` and `accelerate` packages), and the model is
written as fp32 safetensors with the tokenizer and the chat template the file holds, into OUT (a new directory:
an existing one is never overwritten; a conversion that fails leaves nothing behind). Then:

    eagle3 train model=auto model.verifier.path=OUT data=online data.path=rows.jsonl
"""

from __future__ import annotations

import argparse
from pathlib import Path

from eagle3.cli.tail import finish


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="eagle3 verifier", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gguf = commands.add_parser("from-gguf", help="a GGUF file -> an fp32 safetensors dir with its tokenizer",
                               description="Convert a GGUF file (llama.cpp's format) into an fp32 safetensors "
                                           "Hugging Face dir with its tokenizer and chat template.")
    gguf.add_argument("file", metavar="FILE", help="the .gguf file")
    gguf.add_argument("out", metavar="OUT", help="the directory to write (must not exist)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)

    def convert() -> int:
        from eagle3.verifier.gguf import from_gguf

        print(from_gguf(Path(args.file), Path(args.out)))
        return 0

    return finish(convert, interrupted="interrupted (Ctrl-C): nothing was written")
