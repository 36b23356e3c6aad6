"""Does a drafter pay off? The serving speedup that per-position accept rates predict at given step costs.

    python -m eagle3.eval.speedup --accept-rates 0.5 0.3 0.2 --baseline-ms 12.2 --verify-ms 30 --draft-ms 1
    python -m eagle3.eval.speedup --accept RUN/accept_k3.json --run RUN --measure     # costs measured here
    python -m eagle3.eval.speedup --run RUN --measure --wallclock                     # and checked by decoding
    python -m eagle3.eval.speedup --accept RUN/serve_vllm_k5_t0.json \
        --engine-costs RUN/serve_vllm_k1_t0.json RUN/serve_vllm_k5_t0.json   # costs of served runs (eagle3.serve)
    python -m eagle3.eval.speedup --accept RUN/serve_vllm_k5_t0.json \
        --engine-costs RUN/serve_vllm_k1_t0.json           # k=1 served, the draft timed by eagle3.serve meanwhile

The model (one sequence, chain drafts, as eagle3.eval.accept decodes):
    tokens_per_step(k) = 1 + sum_{j<k} r_j        r_j: share of verify steps whose draft token j is accepted
    step_ms(k)         = verify_ms(k) + k * draft_ms
    speedup(k)         = (tokens_per_step(k) / step_ms(k)) / (1 / baseline_ms)
baseline_ms is the verifier's plain decoding step (one token per forward); verify_ms(k) its forward over the
k+1 tokens of a verify step; draft_ms one draft forward (a chain of k costs k of them). The break-even
acceptance length at k is step_ms(k) / baseline_ms: below it, speculation is slower than plain decoding.
From a serving engine's reports (--engine-costs) the step is fitted as fixed + per_token * k plain steps: a fixed
part per speculative step (the verify forward, input preparation, rejection sampling, scheduling: verify_ms, the
same at every k) and a part per draft token (a draft forward and one more token of verify forward: draft_ms);
from one report at k=1, per_token is the draft forward's own cost (timed by eagle3.serve between the report's
requests, written in it as draft_forward_ms; or --measure, or --draft-ms) and fixed the rest.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import ConfigError, UserError


@dataclass
class StepCosts:
    """Milliseconds per step: the verifier's plain decoding step, its verify step per k, one draft forward."""

    baseline_ms: float
    verify_ms: dict[int, float]  # k -> the verifier's forward over k+1 new tokens
    draft_ms: float
    source: str = "given"
    fitted_ks: tuple[int, ...] = ()  # the k whose served steps the costs were fitted to


def predict(rates: Sequence[float], costs: StepCosts) -> dict[str, Any]:
    """One row per k = 1..len(rates) (the k a row's rates cover), the best k and its break-even acceptance."""
    rows = []
    for k in range(1, len(rates) + 1):
        tokens_per_step = 1.0 + sum(rates[:k])
        step_ms = costs.verify_ms[k] + k * costs.draft_ms
        rows.append({"k": k, "tokens_per_step": tokens_per_step, "step_ms": step_ms,
                     "tokens_per_s": 1000.0 * tokens_per_step / step_ms,
                     "speedup": tokens_per_step / step_ms * costs.baseline_ms,
                     "break_even_accept_len": step_ms / costs.baseline_ms})
    best = max(rows, key=lambda r: r["speedup"])
    return {"best_k": best["k"], "break_even_accept_len": best["break_even_accept_len"],
            "pays_off": best["speedup"] > 1.0, "baseline_ms": costs.baseline_ms,
            "baseline_tokens_per_s": 1000.0 / costs.baseline_ms, "draft_ms": costs.draft_ms,
            "costs_source": costs.source, "accept_rates": list(rates), "rows": rows}


def check_rates(rates: Any) -> list[float]:
    if not isinstance(rates, list | tuple) or not all(isinstance(r, int | float) for r in rates):
        raise ConfigError(f"accept rates must be a list of numbers, got {rates!r}")
    rates = [float(r) for r in rates]
    if not rates:
        raise ConfigError("no accept rates")
    if not all(0.0 <= r <= 1.0 for r in rates):
        raise ConfigError(f"accept rates must lie in [0, 1], got {rates}")
    if any(b > a + 1e-9 for a, b in zip(rates, rates[1:])):
        raise ConfigError(f"accept rates of a chain cannot increase with the position (token j+1 is accepted only "
                          f"if token j is), got {rates}")
    return rates


def rates_from_report(path: Path) -> tuple[list[float], str]:
    """accept_rate of an `eagle3.eval.accept` report (measured)."""
    if not path.is_file():
        raise ConfigError(f"--accept: {path} does not exist or is not a file")
    try:
        report = json.loads(path.read_text())
        rates = report["accept_rate"]
    except (ValueError, KeyError, TypeError):  # ValueError: not JSON, or not text
        raise ConfigError(f"--accept: {path} is not an eagle3.eval.accept report (no accept_rate)") from None
    temperature = report.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ConfigError(f"--accept: {path} states temperature {temperature!r}, not a number; an eagle3.eval.accept "
                          f"report holds the temperature it measured at")
    return rates, f"measured: {path} (k={report.get('k')}, temperature {temperature:g})"


def rates_from_run(run: Path) -> tuple[list[float], str]:
    """full_acc_j of the run's best val row: teacher-forced, an estimate that overstates served acceptance."""
    from eagle3.rundir.files import SUMMARY, RunDir

    room = RunDir(run)
    if not room.file(SUMMARY).is_file():
        raise ConfigError(f"--run: {run} is not a finished run dir (no {SUMMARY})")
    try:
        best = room.read_summary().best
    except ConfigError as e:
        raise ConfigError(f"--run: {e}") from None
    rates = [best[f"full_acc_{j}"] for j in range(len(best)) if f"full_acc_{j}" in best]
    if not rates:
        raise ConfigError(f"--run: the best val row of {run} has no full_acc_* entries")
    return rates, (f"ESTIMATE: val full_acc_* of {run} (teacher-forced, step {best.get('step')}); served acceptance "
                   "is usually lower, measure it with python -m eagle3.eval.accept")


def given_costs(args: argparse.Namespace, max_k: int) -> StepCosts:
    if args.baseline_ms is None or args.verify_ms is None:
        raise ConfigError("give the step costs (--baseline-ms and --verify-ms, optionally --draft-ms) or --measure")
    verify = args.verify_ms
    if len(verify) not in (1, max_k):
        raise ConfigError(f"--verify-ms takes one value (the same for every k) or one per k = 1..{max_k}, "
                          f"got {len(verify)}")
    draft_ms = args.draft_ms or 0.0
    values = [args.baseline_ms, *verify, draft_ms]
    if not all(math.isfinite(v) and v >= 0 for v in values) or args.baseline_ms <= 0 or min(verify) <= 0:
        raise ConfigError(f"step costs must be positive, finite milliseconds (--draft-ms may be 0), got baseline "
                          f"{args.baseline_ms}, verify {verify}, draft {draft_ms}")
    return StepCosts(args.baseline_ms, {k: verify[0 if len(verify) == 1 else k - 1] for k in range(1, max_k + 1)},
                     draft_ms, "given")


# Which speedup of an eagle3.serve report --clock takes: wall (all tokens over all request time), median (of the
# per-prompt ratios), cpu (the servers' CPU time).
SERVED_SPEEDUP = {"wall": "speedup", "median": "speedup_median", "cpu": "speedup_cpu"}


@dataclass
class ServedStep:
    """One eagle3.serve report as the engine's step-cost fit reads it: k, its step in plain steps
    (accept_len / speedup: the tokens one step makes over the tokens one plain step makes in its time), the
    plain step in ms, and what must agree between reports fitted together."""

    k: int
    plain_steps: float
    plain_ms: float
    setup: tuple[Any, ...]  # engine, version, dtype
    run: tuple[Any, ...]    # checkpoint, verifier, temperature: the served run
    path: Path
    speedup: float
    accept_len: float
    draft_ms: float | None = None  # the draft forward eagle3.serve timed between the requests (`clock`'s time)


def served_step(path: Path, clock: str) -> ServedStep:
    if not path.is_file():
        raise ConfigError(f"--engine-costs: {path} does not exist or is not a file")
    try:
        r = json.loads(path.read_text())
        k, accept_len = int(r["k"]), float(r["accept_len"])
        speedup = float(r[SERVED_SPEEDUP[clock]])
        plain = float(r["plain_tokens_per_cpu_s" if clock == "cpu" else "plain_tokens_per_s"])
        temperature = r["temperature"]
        if isinstance(temperature, bool) or not math.isfinite(temperature) or temperature < 0:
            raise ValueError(temperature)
        timed_draft = r.get("draft_forward_ms")  # reports written before eagle3.serve timed the draft lack it
        draft_ms = None if timed_draft is None else float(timed_draft["cpu" if clock == "cpu" else "wall"])
        if draft_ms is not None and not (math.isfinite(draft_ms) and draft_ms > 0):
            raise ValueError(draft_ms)
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"--engine-costs: {path} is not an eagle3.serve report (serve_vllm_k*_t*.json)") from None
    if not (speedup > 0 and plain > 0 and accept_len >= 1):
        raise ConfigError(f"--engine-costs: {path} has speedup {speedup}, plain tokens/s {plain}, accept_len "
                          f"{accept_len}; a measured report has positive ones")
    return ServedStep(k, accept_len / speedup, 1000.0 / plain,
                      (r.get("engine"), r.get("engine_version"), r.get("dtype")),
                      (r.get("checkpoint"), r.get("verifier"), temperature), path, speedup, accept_len, draft_ms)


def fit_step(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, per_token) of step(k) = fixed + per_token * k, in plain steps, least squares through two or more
    (k, step) points. fixed: the verify forward and the per-step work of speculation (input preparation, rejection
    sampling, scheduling); per_token: one draft forward and what one more token adds to the verify forward."""
    assert len({k for k, _ in points}) >= 2, points
    n = len(points)
    mean_k = sum(k for k, _ in points) / n
    mean_s = sum(s for _, s in points) / n
    per_token = (sum((k - mean_k) * (s - mean_s) for k, s in points)
                 / sum((k - mean_k) ** 2 for k, _ in points))
    return mean_s - per_token * mean_k, per_token


def engine_costs(paths: Sequence[Path], max_k: int, clock: str = "wall", draft_ms: float | None = None
                 ) -> StepCosts:
    """Step costs from eagle3.serve reports: each report's plain server gives the plain step, and its measured
    speedup (`clock` cpu: in the servers' CPU time) and accept_len give its step, accept_len / speedup plain
    steps. Reports at two or more k (one engine and dtype): `fit_step` fits step(k) = fixed + per_token * k to
    them. One report, at k=1: per_token is the draft forward's own cost, `draft_ms` (measured by the harness, or
    given) or else the one eagle3.serve timed between the report's requests, and fixed what is left of step(1): an
    engine's per-step work is paid once per step, whatever k, and each further draft token adds a draft forward."""
    steps = [served_step(path, clock) for path in paths]
    if len(steps) == 1 and steps[0].k != 1:
        raise ConfigError(f"--engine-costs: {paths[0]} was served at k={steps[0].k}; the verify step is calibrated "
                          "at k=1 (python -m eagle3.serve RUN --k 1), or give reports at two or more k")
    timed_by = "given" if draft_ms is not None else "timed by eagle3.serve between the requests"
    if len(steps) == 1 and draft_ms is None:
        draft_ms = steps[0].draft_ms
    if len(steps) == 1 and draft_ms is None:
        raise ConfigError(f"--engine-costs: one report ({paths[0]}, k=1) fixes step(1) alone, not how it grows with "
                          "k, and it holds no draft_forward_ms (eagle3.serve times the draft since it writes one): "
                          "give the draft forward's cost (--measure: measured here with the run's draft, or "
                          "--draft-ms), or reports at two or more k")
    if draft_ms is not None and not (math.isfinite(draft_ms) and draft_ms > 0):
        raise ConfigError(f"--draft-ms: the draft forward's cost must be a positive, finite number of ms, got "
                          f"{draft_ms}")
    if len(steps) > 1 and draft_ms is not None:
        raise ConfigError("--engine-costs: reports at several k give the per-token cost by their fit; --measure or "
                          "--draft-ms goes with one report, at k=1")
    ks = [s.k for s in steps]
    if len(set(ks)) != len(ks):
        raise ConfigError(f"--engine-costs: the reports are at k = {ks}; a fit needs each k once")
    if len({s.setup for s in steps}) > 1:
        raise ConfigError("--engine-costs: the reports come from different engines or dtypes ("
                          + "; ".join(f"{s.path}: {' '.join(map(str, s.setup))}" for s in steps) + "); fit one's")
    if len({s.run for s in steps}) > 1:
        raise ConfigError("--engine-costs: the reports come from different served runs ("
                          + "; ".join(f"{s.path}: checkpoint {s.run[0]}, verifier {s.run[1]}, temperature {s.run[2]}"
                                      for s in steps) + "); fit the reports of one checkpoint, verifier and "
                          "temperature (python -m eagle3.serve RUN --k 1 5)")
    baseline_ms = sum(s.plain_ms for s in steps) / len(steps)
    if draft_ms is None:
        fixed, per_token = fit_step([(s.k, s.plain_steps) for s in steps])
        form = f"{fixed:.3f} + {per_token:.3f} k"
    else:
        per_token = draft_ms / baseline_ms
        fixed = steps[0].plain_steps - per_token
        form = f"{fixed:.3f} + {per_token:.3f} k (per token: the draft forward, {draft_ms:.3f} ms, {timed_by})"
    if fixed <= 0 or per_token < 0:
        raise ConfigError("--engine-costs: step(k) = {:.3f} + {:.3f} k plain steps (from k = {}: {}) has a cost "
                          "below zero: the reports' timings are noise; serve more prompts or tokens".format(
                              fixed, per_token, ks, ", ".join(f"{s.plain_steps:.3f}" for s in steps)))
    engine, version, dtype = steps[0].setup
    return StepCosts(baseline_ms, dict.fromkeys(range(1, max_k + 1), fixed * baseline_ms), per_token * baseline_ms,
                     f"engine: {engine} {version} {dtype}, plain server and k = {', '.join(map(str, ks))} of "
                     f"{', '.join(str(s.path) for s in steps)}, {clock} time; step(k) = {form} plain steps",
                     fitted_ks=tuple(ks))


def served_speedups(first: ServedStep, ks: Sequence[int], clock: str = "wall") -> dict[int, tuple[float, float]]:
    """k -> (measured speedup (`clock` cpu: in the servers' CPU time), accept_len) of the eagle3.serve reports
    beside the `first` one fitted (same dir, temperature) at `ks`."""
    found = {}
    for k in ks:
        report = first.path.parent / f"serve_vllm_k{k}_t{first.run[2]:g}.json"
        if report.is_file():
            step = served_step(report, clock)
            found[k] = (step.speedup, step.accept_len)
    return found


def measure_costs(verifier, draft, ks: Sequence[int], context_len: int, repeats: int = 40,
                  clock: str = "wall") -> StepCosts:
    """The harness's own step costs (eagle3.decoding.drafting, KV-cached) at `context_len` tokens of context, on the
    models' device: the median over `repeats` of the plain decoding step (verifier forward over 1 new token and
    the choice of it), the verify step (forward over k+1 new tokens with aux states, the acceptance, the crop,
    the aux bookkeeping), and one draft forward (a chain of one token after one newly accepted token). The
    pieces are timed in turn within each repeat, so that a busy machine slows them alike."""
    import statistics

    import torch

    from eagle3.decoding.drafting import GREEDY, VerifierCache, choose, verify
    from eagle3.eval.measure import aux_layer_ids

    aux_ids = aux_layer_ids(draft, verifier)
    device = next(verifier.parameters()).device
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, verifier.config.vocab_size, (context_len + repeats + max(ks) + 8,), generator=gen).tolist()
    with torch.no_grad():
        plain = VerifierCache(verifier)
        plain.forward(ids[:context_len])

        def plain_step():  # as plain_decode: one token, chosen (its crop, which plain decoding has not, is untimed)
            logits, _ = plain.forward(ids[context_len:context_len + 1])
            choose(logits[-1], GREEDY)

        checker = VerifierCache(verifier, aux_ids)
        _, aux = checker.forward(ids[:context_len])

        def verify_step(k):
            def step():
                logits, new_aux = checker.forward(ids[context_len:context_len + 1 + k])
                n, _ = verify(ids[context_len + 1:context_len + 1 + k], logits, None, GREEDY)
                checker.crop(context_len)
                torch.cat([aux, new_aux[:n + 1]])
            return step

        draft_step = draft_forward(draft, ids, aux, context_len)
        pieces: dict[Any, Callable[[], Any]] = {"baseline": plain_step, "draft": draft_step,
                                                **{k: verify_step(k) for k in ks}}
        samples: dict[Any, list[float]] = {name: [] for name in pieces}
        for r in range(repeats + 3):  # the first three warm up
            for name, fn in pieces.items():
                step_ms = timed(fn, device)[0][clock] * 1000.0
                if name == "baseline":
                    plain.crop(context_len)
                if r >= 3:
                    samples[name].append(step_ms)
    ms = {name: statistics.median(v) for name, v in samples.items()}
    return StepCosts(ms["baseline"], {k: ms[k] for k in ks}, ms["draft"],
                     f"measured here ({device.type}, context {context_len} tokens, {clock} time)")


def draft_forward(draft, ids: Sequence[int], aux, context_len: int) -> Callable[[], None]:
    """One draft forward, repeatable: a chain of one token after one newly accepted token at `context_len` tokens
    of context (`ids` and the verifier's aux states `aux` cover at least context_len + 1 and context_len), the
    chain's cache cropped back after it so that the next call does the same work."""
    from eagle3.decoding.drafting import DraftChain, crop_to

    chain = DraftChain(draft, cached=True)
    chain.propose(ids[:context_len], aux[:context_len - 1], 1)

    def step() -> None:
        chain.propose(ids[:context_len + 1], aux[:context_len], 1)
        crop_to(chain.cache, context_len - 1)  # the same one new index again next time
        chain.length = context_len - 1

    return step


class DraftTimer:
    """The draft forward's cost, timed a few forwards at a time (`sample`) on `threads` torch threads, wall and
    CPU time, as measure_costs times it: eagle3.serve samples it between the engine's requests, so that the draft's
    cost is taken in the same minutes as the served steps it calibrates (a shared machine's speed moves between
    minutes)."""

    WARMUP = 3

    def __init__(self, verifier, draft, context_len: int, threads: int):
        import torch

        from eagle3.decoding.drafting import VerifierCache
        from eagle3.eval.measure import aux_layer_ids

        self.device, self.context_len, self.threads = next(verifier.parameters()).device, context_len, threads
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(0, verifier.config.vocab_size, (context_len + 1,), generator=gen).tolist()
        with torch.no_grad():
            _, aux = VerifierCache(verifier, aux_layer_ids(draft, verifier)).forward(ids)
            self.step = draft_forward(draft, ids, aux, context_len)
        self.samples: dict[str, list[float]] = {"wall": [], "cpu": []}
        self.sample(self.WARMUP, keep=False)

    def sample(self, n: int, keep: bool = True) -> None:
        import torch

        from eagle3.eval.measure import torch_threads

        with torch.no_grad(), torch_threads(self.threads):
            for _ in range(n):
                seconds = timed(self.step, self.device)[0]
                if keep:
                    for clock in self.samples:
                        self.samples[clock].append(seconds[clock] * 1000.0)

    def result(self) -> dict[str, Any]:
        """{"wall", "cpu": median ms, "samples", "context", "threads"}"""
        import statistics

        return {**{clock: statistics.median(v) for clock, v in self.samples.items()},
                "samples": len(self.samples["wall"]), "context": self.context_len, "threads": self.threads}


def default_clock(device: str) -> str:
    """CPU time of the process on a CPU with torch on one thread: the work itself, which other processes on a
    shared machine do not stretch as they stretch wall time; wall time on a GPU (kernels run asynchronously)."""
    import torch

    return "cpu" if device == "cpu" and torch.get_num_threads() == 1 else "wall"


def timed(fn, device) -> tuple[dict[str, float], Any]:
    """({"wall": seconds, "cpu": seconds of the process's CPU time}, fn's result); CUDA synchronized."""
    import time

    import torch

    cuda = torch.device(device).type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    return {"wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}, out


def format_prediction(p: dict[str, Any], rates_source: str) -> str:
    lines = [f"accept rates: {' '.join(f'{r:.4f}' for r in p['accept_rates'])}   ({rates_source})",
             f"costs ({p['costs_source']}): baseline {p['baseline_ms']:.3f} ms/token "
             f"({p['baseline_tokens_per_s']:.1f} tokens/s), draft {p['draft_ms']:.3f} ms/forward",
             f"{'k':>3}{'tokens/step':>13}{'step ms':>10}{'tokens/s':>11}{'speedup':>9}{'break-even':>12}"
             + (f"{'at served AL':>14}{'served':>9}{'error':>8}" if any("served_speedup" in r for r in p["rows"])
                else "")]
    for r in p["rows"]:
        lines.append(f"{r['k']:>3}{r['tokens_per_step']:>13.3f}{r['step_ms']:>10.3f}{r['tokens_per_s']:>11.1f}"
                     f"{r['speedup']:>9.3f}{r['break_even_accept_len']:>12.3f}"
                     + (f"{r['predicted_at_served_accept_len']:>14.3f}{r['served_speedup']:>9.3f}"
                        f"{100 * r['error']:>7.1f}%" + ("  (fitted)" if r["in_fit"] else "")
                        if "served_speedup" in r else ""))
    best = next(r for r in p["rows"] if r["k"] == p["best_k"])
    if p["pays_off"]:
        lines.append(f"best k = {p['best_k']}: {best['speedup']:.2f}x over no speculation "
                     f"(break-even acceptance length there: {p['break_even_accept_len']:.2f} tokens/step)")
    else:
        lines.append(f"SLOWDOWN at every k: the best, k = {p['best_k']}, runs at {best['speedup']:.2f}x; it needs "
                     f"{p['break_even_accept_len']:.2f} tokens per verify step to break even and gets "
                     f"{best['tokens_per_step']:.2f}. Serve without this drafter, or cut the verify step's cost.")
    return "\n".join(lines)


def wallclock(verifier, draft, prompts: Sequence[Sequence[int]], ks: Sequence[int], max_new_tokens: int,
              measure: Callable[[], StepCosts], rounds: int = 5) -> list[dict[str, Any]]:
    """Checks the model against real decoding here. Each round measures the step costs (`measure`), then decodes
    `prompts` plainly and, for each k, speculatively (greedy, the KV-cached harness), and pairs the speedup
    predicted from that round's costs and the accept rates its decoding measured with that round's measured
    ratio (plain time / speculative time, wall and CPU): a machine busier in one round than another then
    moves prediction and measurement together. Reported: the medians over the rounds."""
    import functools
    import statistics

    from eagle3.decoding.drafting import plain_decode, speculative_decode
    from eagle3.eval.measure import acceptance, aux_layer_ids

    aux_ids = aux_layer_ids(draft, verifier)
    device = next(verifier.parameters()).device

    def decode_plain() -> list[Any]:
        return [plain_decode(verifier, p, max_new_tokens) for p in prompts]

    def decode_speculative(k: int) -> list[Any]:
        return [speculative_decode(verifier, draft, p, k, max_new_tokens, aux_ids, cached=True) for p in prompts]

    runs: dict[Any, Callable[[], Any]] = {"plain": decode_plain,
                                          **{k: functools.partial(decode_speculative, k) for k in ks}}
    per_round: dict[int, dict[str, list[float]]] = {k: {"predicted": [], "wall": [], "cpu": []} for k in ks}
    rates = {}
    for _ in range(rounds):
        costs = measure()
        seconds = {}
        for name, fn in runs.items():
            seconds[name], out = timed(fn, device)
            if name != "plain":
                rates[name] = acceptance(out, name)["accept_rate"]
        for k in ks:
            per_round[k]["predicted"].append(predict(rates[k], costs)["rows"][k - 1]["speedup"])
            for clock in ("wall", "cpu"):
                per_round[k][clock].append(seconds["plain"][clock] / seconds[k][clock])
    rows = []
    for k in ks:
        predicted = statistics.median(per_round[k]["predicted"])
        row = {"k": k, "accept_rate": rates[k], "predicted_speedup": predicted, "rounds": per_round[k]}
        for clock in ("wall", "cpu"):
            measured = statistics.median(per_round[k][clock])
            row |= {f"measured_speedup_{clock}": measured, f"error_{clock}": predicted / measured - 1}
        rows.append(row)
    return rows


# --wallclock decodes as eagle3.eval.accept does: these options' checks are its schema's.
WALLCLOCK_FLAGS = {"num_prompts": "--num-prompts", "max_new_tokens": "--max-new-tokens"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from eagle3.config import AcceptEvalConfig, Device
    from eagle3.schema_cli import add_fields

    p = argparse.ArgumentParser(prog="python -m eagle3.eval.speedup", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--accept", type=Path, help="an eagle3.eval.accept report (accept_k*.json): measured rates")
    p.add_argument("--accept-rates", type=float, nargs="+", metavar="R", help="per-position accept rates r_0 r_1 ...")
    p.add_argument("--run", type=Path, help="a finished run dir: its best val full_acc_* as rates (an estimate) "
                                            "unless --accept/--accept-rates; its draft and verifier for --measure")
    p.add_argument("--checkpoint", help="draft checkpoint dir for --measure (default with --run: its best)")
    p.add_argument("--verifier", help="verifier dir for --measure (default with --run: the run's)")
    p.add_argument("--baseline-ms", type=float, help="the verifier's plain decoding: ms per token")
    p.add_argument("--verify-ms", type=float, nargs="+", metavar="MS",
                   help="the verifier's forward over k+1 tokens, ms: one value for every k, or one per k")
    p.add_argument("--draft-ms", type=float, help="one draft forward, ms (default 0; with one --engine-costs "
                                                   "report at k=1: the cost of each draft token)")
    p.add_argument("--measure", action="store_true", help="measure the step costs here with the draft and verifier")
    p.add_argument("--engine-costs", type=Path, nargs="+", metavar="SERVE_JSON",
                   help="step costs from eagle3.serve reports: step(k) = fixed + per_token * k plain steps, fitted "
                        "to reports at two or more k (e.g. k=1 and the largest), or from one at k=1 with per_token "
                        "the draft forward's cost (the one eagle3.serve timed between its requests, or --measure, "
                        "or --draft-ms); the serve reports at every k beside "
                        "the first are shown as measured, with the speedup the costs predict at the accept_len "
                        "each served with")
    p.add_argument("--context", type=int, default=64, help="context length (tokens) the costs are measured at")
    p.add_argument("--wallclock", action="store_true", help="also decode the run's val prompts with and without "
                                                            "speculation and compare the measured ratio (needs --run)")
    add_fields(p, AcceptEvalConfig, WALLCLOCK_FLAGS, "eval.accept", defaults={"max_new_tokens": 64},
               helps={"num_prompts": "prompts decoded by --wallclock",
                      "max_new_tokens": "tokens per prompt for --wallclock"})
    p.add_argument("--device", default=Device.auto.value, choices=[d.value for d in Device])
    p.add_argument("--clock", choices=["wall", "cpu", "median"], default=None,
                   help="what --measure times (default: cpu time on a CPU with one torch thread, which a busy "
                        "shared machine does not stretch; wall time on a GPU); with --engine-costs: which of the "
                        "serve reports' speedups (default wall; median: of the per-prompt ratios)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default on CPU: 1)")
    p.add_argument("--json", type=Path, help="write the prediction here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        if args.json is not None and args.json.exists():
            raise ConfigError(f"--json: {args.json} exists; nothing was overwritten: choose another path")
        if args.json is not None:  # before measuring: its dir must be one that can be made and written
            from eagle3.rundir.files import output_dir_problem

            problem = output_dir_problem(args.json.parent.absolute())
            if problem:
                raise ConfigError(f"--json: {problem}; choose another path")
        result, text = run(args)
    except UserError as e:  # also a run's data or checkpoint problem, found by resolve_inputs or load_draft
        raise SystemExit(f"error: {e}") from None
    print(text)
    if args.json:
        from eagle3.safe_write import write_text

        try:
            write_text(args.json.parent, args.json, json.dumps(result, indent=2) + "\n")
        except UserError as e:  # a symlink at --json: never written through
            raise SystemExit(f"error: --json: {e}") from None
        print(f"json: {args.json}")


def run(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    sources = [s for s in (args.accept, args.accept_rates) if s is not None]
    if len(sources) > 1:
        raise ConfigError("give one source of accept rates: --accept or --accept-rates")
    if args.accept is not None:
        rates, source = rates_from_report(args.accept)
    elif args.accept_rates is not None:
        rates, source = args.accept_rates, "given"
    elif args.run is not None:
        rates, source = rates_from_run(args.run)
    else:
        raise ConfigError("give accept rates: --accept accept_k*.json, --accept-rates r0 r1 ..., or --run RUN "
                          "(its val full_acc_*, an estimate)")
    rates = check_rates(rates)
    ks = list(range(1, len(rates) + 1))
    if args.engine_costs is not None:
        if args.wallclock or args.baseline_ms is not None or args.verify_ms is not None:
            raise ConfigError("give one source of step costs: --engine-costs (with --measure or --draft-ms for one "
                              "report at k=1), --measure, or --baseline-ms/--verify-ms")
        if args.measure and args.draft_ms is not None:
            raise ConfigError("give the draft forward's cost once: --measure (measured here) or --draft-ms")
        draft_ms = measured_draft_ms(args) if args.measure else args.draft_ms
        return against_engine(rates, source, args.engine_costs, args.clock or "wall", draft_ms)
    if not (args.measure or args.wallclock):
        costs = given_costs(args, len(rates))
        prediction = predict(rates, costs)
        return {**prediction, "accept_source": source}, format_prediction(prediction, source)
    if args.wallclock and args.run is None:
        raise ConfigError("--wallclock decodes the val prompts of a run: give --run")
    from eagle3.config import AcceptEvalConfig
    from eagle3.schema_cli import checked

    checked(args, AcceptEvalConfig, WALLCLOCK_FLAGS, "eval.accept", AcceptEvalConfig.check_values)
    for flag, value, low in (("--context", args.context, 2), ("--threads", args.threads or 1, 1)):
        if value < low:
            raise ConfigError(f"{flag} must be >= {low}, got {value}")
    verifier, draft, device = load_models(args)
    max_positions = getattr(verifier.config, "max_position_embeddings", None) or 1 << 30
    if args.context + len(rates) + 1 > max_positions:
        raise ConfigError(f"--context {args.context} + a verify step of {len(rates) + 1} tokens passes the verifier's "
                          f"max_position_embeddings ({max_positions})")
    from eagle3.eval.measure import torch_threads

    with torch_threads(args.threads or (1 if device == "cpu" else None)):
        clock = args.clock or default_clock(device)
        costs = measure_costs(verifier, draft, ks, args.context, clock=clock)
        prediction = predict(rates, costs)
        result = {**prediction, "accept_source": source, "verify_ms": costs.verify_ms}
        text = format_prediction(prediction, source)
        if args.wallclock:
            from eagle3.eval.accept import resolve_inputs
            from eagle3.eval.prompts import val_split_prompts

            val_split = resolve_inputs(accept_args(args))[2]
            assert val_split is not None  # --wallclock requires --run, whose val split it is
            data_dir, train_ratio = val_split
            prompts = val_split_prompts(data_dir, train_ratio, args.num_prompts)
            rows = wallclock(verifier, draft, prompts, ks, args.max_new_tokens,
                             lambda: measure_costs(verifier, draft, ks, args.context, clock=clock))
            result["wallclock"] = rows
            text += "\n" + format_wallclock(rows, len(prompts), args.max_new_tokens)
    return result, text


def measured_draft_ms(args: argparse.Namespace) -> float:
    """One draft forward of the run's draft, measured here as --measure measures it (its --threads: give the
    threads the engine's worker runs with)."""
    from eagle3.eval.measure import torch_threads

    verifier, draft, device = load_models(args)
    with torch_threads(args.threads or (1 if device == "cpu" else None)):
        return measure_costs(verifier, draft, [1], args.context, clock=default_clock(device)).draft_ms


def against_engine(rates: list[float], source: str, reports: Sequence[Path], clock: str,
                   draft_ms: float | None = None) -> tuple[dict[str, Any], str]:
    """The prediction from the engine's step costs, with the serve reports beside the first (same dir and
    temperature) as measured: at each k served, the speedup the costs predict at the accept_len it served with
    (which checks the costs alone; rates of one k hold only roughly at another) and its error."""
    costs = engine_costs(reports, len(rates), clock, draft_ms)
    prediction = predict(rates, costs)
    measured = served_speedups(served_step(reports[0], clock), range(1, len(rates) + 1), clock)
    for row in prediction["rows"]:
        if row["k"] in measured:
            speedup, accept_len = measured[row["k"]]
            at_served = accept_len / row["step_ms"] * prediction["baseline_ms"]
            row |= {"served_speedup": speedup, "predicted_at_served_accept_len": at_served,
                    "error": at_served / speedup - 1, "in_fit": row["k"] in costs.fitted_ks}
    return ({**prediction, "accept_source": source, "fitted_ks": list(costs.fitted_ks),
             "fixed_plain_steps": costs.verify_ms[1] / costs.baseline_ms,
             "per_token_plain_steps": costs.draft_ms / costs.baseline_ms}, format_prediction(prediction, source))


def format_wallclock(rows: list[dict[str, Any]], prompts: int, max_new_tokens: int) -> str:
    lines = [f"decoding, KV-cached harness, {prompts} prompts x {max_new_tokens} greedy tokens, speculative vs plain; "
             "medians over rounds, each predicted from its own measured costs and the rates its decoding measured:",
             f"{'k':>3}{'accept_len':>12}{'predicted':>11}{'wall':>8}{'error':>8}{'cpu':>8}{'error':>8}"]
    for r in rows:
        lines.append(f"{r['k']:>3}{1 + sum(r['accept_rate']):>12.3f}{r['predicted_speedup']:>11.3f}"
                     f"{r['measured_speedup_wall']:>8.3f}{100 * r['error_wall']:>7.1f}%"
                     f"{r['measured_speedup_cpu']:>8.3f}{100 * r['error_cpu']:>7.1f}%")
    return "\n".join(lines)


def accept_args(args: argparse.Namespace) -> argparse.Namespace:
    return argparse.Namespace(checkpoint=args.checkpoint, verifier=args.verifier, run=args.run,
                              prompts=None if args.run else "-")


def load_models(args: argparse.Namespace):
    """The draft and verifier of --run or --checkpoint/--verifier, as eagle3.eval.accept loads them."""
    import torch

    from eagle3.console import quiet_libraries
    from eagle3.eval.accept import resolve_inputs
    from eagle3.init.checkpoint import load_draft
    from eagle3.verifier.model import Verifier

    if args.run is None and not (args.checkpoint and args.verifier):
        raise ConfigError("--measure needs the models: --run RUN, or --checkpoint and --verifier")
    checkpoint, verifier_dir, _ = resolve_inputs(accept_args(args))
    quiet_libraries()
    device = "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    verifier = Verifier(verifier_dir, key="--verifier").load(device)
    try:
        draft = load_draft(checkpoint, "sdpa", device, verifier_dir=verifier_dir).float().eval()
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the draft {checkpoint} for the verifier {verifier_dir}: {e}") from None
    return verifier, draft, device


if __name__ == "__main__":
    main(sys.argv[1:])
