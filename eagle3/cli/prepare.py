"""`eagle3 prepare --model DIR --data ROWS --out DIR`: run a local Hugging Face causal LM (in transformers, or served
by vLLM) over data rows and write them with its hidden states in speculators' format (eagle3/data/prepare.py).

    eagle3 prepare --model /models/verifier --data rows.jsonl --out /data/ds [--aux-layer-ids 2 16 29]
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from eagle3.cli.fields import add_fields
from eagle3.cli.tail import finish
from eagle3.config import DataConfig, Device, HiddenStatesDtype, TokenRows
from eagle3.errors import UserError

ENGINES = ("transformers", "vllm")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="eagle3 prepare",
                                     description="Runs a local Hugging Face causal LM (in transformers, or "
                                                 "served by vLLM) over data rows and writes them with its hidden "
                                                 "states in speculators' format.")
    parser.add_argument("--model", type=Path, required=True, help="local Hugging Face causal-LM dir (the verifier)")
    parser.add_argument("--data", type=Path, required=True,
                        help='rows: {"input_ids": [...], "loss_mask": [...]}, {"messages": [...]} or ShareGPT\'s '
                             '{"conversations": [...]}, in a JSONL file, a JSON array, a Parquet file or a datasets '
                             "dir (save_to_disk); conversations use the model dir's tokenizer and chat template, "
                             "every assistant turn is trained (docs/data.md)")
    parser.add_argument("--out", type=Path, required=True,
                        help="output dataset dir (resumed if it holds this preparation)")
    parser.add_argument("--aux-layer-ids", type=int, nargs="+",
                        help="verifier layers fed to the draft, output_hidden_states indexing (default [2, N//2, N-3])")
    parser.add_argument("--max-len", type=int, default=8192,
                        help="tokens per row; longer rows are truncated and counted")
    parser.add_argument("--batch-tokens", type=int, default=16384, help="padded tokens per verifier forward")
    parser.add_argument("--device", default=Device.auto.value, choices=[d.value for d in Device])
    # The options a run's `data` config also has default to its schema's values (eagle3/config/data.py DataConfig).
    parser.add_argument("--dtype", default=DataConfig.hidden_states_dtype.value,
                        choices=[d.value for d in HiddenStatesDtype],
                        help="dtype the hidden states are stored in")
    add_fields(parser, DataConfig, {"on_bad_sample": "--on-bad-sample"}, "data", helps={
        "on_bad_sample": "a row that cannot be used: stop with its line number, or leave it out and count it"})
    add_fields(parser, TokenRows, {"format": "--format", "max_records": "--max-records"}, "data", helps={
        "format": "what the rows hold; auto: the first row's format (a row of another format is a bad row)",
        "max_records": "read only the file's first N records (bad ones counted among them), never the rest"})
    engine = parser.add_argument_group("the engine that computes the hidden states")
    engine.add_argument("--engine", choices=ENGINES, default="transformers",
                        help="transformers: the verifier loaded here (--device); vllm: vLLM in the serving engine's "
                             "environment (eagle3 serve --install; $EAGLE3_VLLM_PYTHON), on every GPU the "
                             "options below give it, or the CPU; the same files either way")
    engine.add_argument("--tensor-parallel-size", type=int, help="--engine vllm: GPUs per pipeline stage")
    engine.add_argument("--pipeline-parallel-size", type=int, help="--engine vllm: pipeline stages")
    engine.add_argument("--enable-expert-parallel", action="store_true",
                        help="--engine vllm: MoE experts spread over the GPUs instead of split by tensor parallelism")
    engine.add_argument("--quantization", help="--engine vllm: vLLM's quantization method (default: what the "
                                               "verifier's config.json says, e.g. compressed-tensors)")
    engine.add_argument("--engine-dtype", choices=["bfloat16", "float16", "float32"],
                        help="--engine vllm: the dtype it computes in (default: bfloat16 on a GPU, float32 on a CPU)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    return finish(lambda: prepared(args), interrupted=(
        "interrupted (Ctrl-C): the hidden-state files written so far are kept, each whole, and the same command "
        "resumes from them"))


def prepared(args: argparse.Namespace) -> int:
    """The dataset written; a full disk is one message (DataError), like every refusal."""
    from eagle3.data.prepare import prepare
    from eagle3.formats.disk import disk_full, disk_full_error

    try:
        prepare(args)
    except (UserError, KeyboardInterrupt):
        raise
    except Exception as e:
        if not disk_full(e, args.out):
            raise
        raise disk_full_error(args.out, "the prepared dataset", "the hidden-state files written so far are kept, "
                              "each whole, and the same command resumes from them",
                              "Free space, or give another --out") from None
    return 0
