"""`eagle3 serve RUN [RUN ...]`: the runs of one verifier served by vLLM beside one plain server of it (and the
n-gram baseline), each measured in turns with them and decoded by the harness; eagle3/cli/serve.py's help says
what each report holds and where the logs go."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from eagle3.serve.report import build_report
from eagle3.serve.request import ServedRun, ServeRequest

# Draft forwards the harness times after each prompt's turn on the servers: the draft's cost in the minutes the
# engine's steps were measured in, the per-token cost of a k=1 calibration (eagle3.eval.speedup --engine-costs).
DRAFT_FORWARDS_PER_PROMPT = 5


def run(args: ServeRequest) -> list[dict[str, Any]]:
    """Serves and measures the runs (their values checked as eval.accept's and eval.serve's); their reports,
    each written as it is done."""
    from eagle3.engine.server import check_port
    from eagle3.engine.venv import engine_python
    from eagle3.errors import ConfigError
    from eagle3.eval.accept import load_prompts

    if not args.runs:
        raise ConfigError("give a run dir (eagle3 serve RUN), or --install to build the engine")
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
        causal = causal_dflash(served.checkpoint) if served.kind == "dflash" else None
        if causal:
            print(f"warning: {served.run_dir}: {causal}", file=sys.stderr)
    with holding(runs):  # before any server starts: one serve (or run, or resume) of a run at a time
        return serve_and_compare(args, engine, runs)


@contextlib.contextmanager
def holding(runs: list[ServedRun]) -> Iterator[None]:
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


def refuse_links_in_the_way(runs: list[ServedRun]) -> None:
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


def check_served_prompts(served: ServedRun, max_new_tokens: int) -> None:
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


def resolve_run(run_dir: Path, args: ServeRequest) -> ServedRun:
    from eagle3.errors import ConfigError
    from eagle3.eval.accept import AcceptRequest, default_k, resolve_inputs
    from eagle3.init.checkpoint import draft_kind
    from eagle3.rundir.files import RESOLVED_CONFIG, SUMMARY

    if not run_dir.is_dir():
        raise ConfigError(f"RUN {run_dir} {'is not a directory' if run_dir.exists() else 'does not exist'}: give "
                          "the dir of a finished training run")
    missing = [name for name in (SUMMARY, RESOLVED_CONFIG) if not (run_dir / name).is_file()]
    if missing:
        raise ConfigError(f"RUN {run_dir} is not a finished run dir (it has no {' and no '.join(missing)}): give "
                          "the dir of a training run that finished")
    checkpoint, verifier_dir, val_split = resolve_inputs(AcceptRequest(run=str(run_dir),
                                                                                   prompts=args.prompts))
    trained = default_k(checkpoint)
    outs = {k: run_dir / f"serve_vllm_k{k}_t{args.temperature:g}.json" for k in dict.fromkeys(args.k or [trained])}
    return ServedRun(run_dir, checkpoint, verifier_dir, val_split, outs, trained_steps=trained,
                     kind=draft_kind(checkpoint))


def causal_dflash(checkpoint: Path) -> str | None:
    """Why vLLM will not run the block of the DFlash checkpoint as it trained (its config.json does not state
    sliding_window_non_causal true: it was written before eagle3 stated it, or by speculators), else None."""
    from eagle3.arch.draft import DFLASH_NON_CAUSAL, dflash_engine_causal, draft_kind_of, has_sliding_layers
    from eagle3.init.files import CheckpointError, read_config

    try:
        config = read_config(checkpoint)
    except CheckpointError:
        return None  # the server's own reading says what is wrong with it
    if draft_kind_of(config) != "dflash" or has_sliding_layers(config) or not dflash_engine_causal(config):
        return None
    stated = json.dumps(config.get(DFLASH_NON_CAUSAL))
    return (f"{checkpoint / 'config.json'} states {DFLASH_NON_CAUSAL}: {stated}, which vLLM reads as 'run every "
            "layer causally': it will run the DFlash block causally, unlike its training and "
            "the harness, so its drafts and accepted counts will differ from the harness's (docs/serving.md#dflash);"
            f" set \"{DFLASH_NON_CAUSAL}\": true there (speculators reads it for sliding-window layers only, which "
            "this draft has none of) to serve it as trained")


def draft_server_command(engine, verifier_dir: Path, port: int, args: ServeRequest, served: ServedRun,
                         k: int) -> list[str]:
    """The speculative server's command for the served run's checkpoint at `k`: vLLM's parallel drafting for a
    P-EAGLE draft, its dflash method for a DFlash one, eagle3 otherwise."""
    from eagle3.engine.server import server_command

    kind = served.kind
    return server_command(engine, verifier_dir, port, args.dtype, served.checkpoint, k, args.seed,
                          parallel_drafting=kind == "peagle", method="dflash" if kind == "dflash" else "eagle3")


def serve_and_compare(args: ServeRequest, engine, runs: list[ServedRun]) -> list[dict[str, Any]]:
    """The plain server for the whole command (its log in the first run's dir); per k, an n-gram server of the
    verifier for the runs served at that k (unless --no-ngram; its log in the first run's dir too), and a
    speculative server per run; each run's measurement takes turns between its speculative server and the plain
    (and n-gram) server, so that every figure of a report is measured in the same minutes. Each report is written
    as it is done."""
    from eagle3.engine.server import free_port, running, server_command
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
                    cmd = draft_server_command(engine, verifier_dir, port, args, served, k)
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
                    report = report_of(args, engine, served, k, measured, harness, log, first_plain)
                    report |= {"plain_log": str(plain.log), "provenance": records[served.run_dir],
                               **({"ngram_log": str(baseline.log)} if baseline is not None else {}),
                               **({"draft_forward_ms": timer.result()} if timer is not None else {})}
                    first_plain = first_plain or report["plain_tokens_per_s"]
                    out = served.outs[k]
                    write_report(served.run_dir, out, report)
                    report["report_path"] = str(out)
                    reports.append(report)
    return reports


def report_of(args: ServeRequest, engine, served: ServedRun, k: int, measured: dict[str, Any], harness,
              log: Path, first_plain: float | None) -> dict[str, Any]:
    """The report of one run at k: the engine's measurement beside the harness's decoding of the same prompts."""
    t = args.temperature
    reference = harness.decode(served.prompts, k, args.max_new_tokens, t, args.seed)
    if t == 0:  # where the engine's greedy tokens leave the harness's, and whether at a near-tie
        reference["divergences"] = harness.divergences(served.prompts, measured["spec"]["tokens"], reference["tokens"])
    return build_report(measured, reference, k, args, engine, served, log, first_plain)


def write_report(run_dir: Path, out: Path, report: dict[str, Any]) -> None:
    """The report as a new file, whole, never over an existing one nor through a link (eagle3.safe_write)."""
    from eagle3.errors import ConfigError
    from eagle3.safe_write import create_file

    try:
        create_file(run_dir, out, json.dumps(report, indent=2) + "\n")
    except FileExistsError:
        raise ConfigError(f"{out} appeared while measuring and is not overwritten") from None
