"""Does a drafter pay off? The serving speedup that per-position accept rates predict at given step costs.

Its command line is `eagle3 speedup` (eagle3/cli/speedup.py).

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

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eagle3.errors import ConfigError


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
        raise ConfigError(f"--accept: {path} is not an eagle3 accept report (no accept_rate)") from None
    temperature = report.get("temperature", 0.0)
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ConfigError(f"--accept: {path} states temperature {temperature!r}, not a number; an eagle3 accept "
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
                   "is usually lower, measure it with eagle3 accept")


def measure_costs(verifier, draft, ks: Sequence[int], context_len: int, repeats: int = 40,
                  clock: str = "wall") -> StepCosts:
    """The harness's own step costs (eagle3.decoding.drafting, KV-cached) at `context_len` tokens of context, on the
    models' device: the median over `repeats` of the plain decoding step (verifier forward over 1 new token and
    the choice of it), the verify step (forward over k+1 new tokens with aux states, the acceptance, the crop,
    the aux bookkeeping), and one draft forward (a chain of one token after one newly accepted token). The
    pieces are timed in turn within each repeat, so that a busy machine slows them alike."""
    import statistics

    import torch

    from eagle3.decoding.aux_layers import aux_layer_ids
    from eagle3.decoding.drafting import GREEDY, VerifierCache, choose, verify

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

        from eagle3.decoding.aux_layers import aux_layer_ids
        from eagle3.decoding.drafting import VerifierCache

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

        from eagle3.device.threads import torch_threads

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

    from eagle3.decoding.aux_layers import aux_layer_ids
    from eagle3.decoding.drafting import speculative_decode
    from eagle3.decoding.plain import plain_decode
    from eagle3.eval.measure import acceptance

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


if __name__ == "__main__":  # the older path of `eagle3 speedup` (eagle3/cli/speedup.py)
    import runpy

    sys.argv[0:1] = ["eagle3", "speedup"]
    runpy.run_module("eagle3.cli", run_name="__main__")
