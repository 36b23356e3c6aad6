"""This machine's sustained matrix-multiply rate, measured at the shapes a training step uses and cached per
machine, so that the plan (eagle3/plan/memory.py) predicts a step's time from what this CPU or GPU does instead of an
assumed share of a guessed peak.

A measurement times torch.mm (fp32, and bf16 where asked) at each shape [m x k] @ [k x n], and the two kernels
whose time is not their FLOPs' (attention under a mask, whose CPU kernels are bound by the score matrix; the loss
over the draft vocabulary), until a small time budget is spent, and keeps the rate per shape. The cache is one
small JSON per machine under `<cache_dir>/roofline/`, keyed by the device's model name, torch's thread count and
torch's version (any of them changes the rate); it holds the rate of every shape measured so far.
`python bench/roofline.py` measures the shapes of a config at length and prints them; `plan=true` measures the
shapes it lacks quickly (well under a second in all) and adds them to the cache.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from eagle3.safe_write import make_dirs, write_text

# A kernel the plan times (eagle3.plan.memory.Shape): ("mm", m, k, n) [m x k] @ [k x n]; ("sdpa", T, heads, head_dim,
# keys, backward) torch's scaled_dot_product_attention with a boolean mask over the T x keys scores, forward (and
# backward when 1; a draft's TTT step on CPU: eagle3.arch.ttt_attention, as the draft computes it there); ("loss", T,
# vocab) a log-softmax and a soft-target loss over T x vocab logits, forward and backward.
Shape = tuple
KERNELS = 3  # the kernels' definitions below: a change makes the cached rates of the old ones unused


def shape_key(shape: Shape, dtype: str = "float32") -> str:
    return f"{'x'.join(map(str, shape))}:{dtype}"


def nominal_flops(shape: Shape) -> float:
    """The work a kernel's rate is counted in: FLOPs of the matrix multiplies (attention: QK^T and AV over every
    score its mask leaves or not, whatever the kernel skips (a draft's TTT step on CPU skips most): the rate is
    counted in the same units as the plan's FLOPs; its backward twice that), and for the loss one per logit."""
    kind, *dims = shape
    if kind == "mm":
        m, k, n = dims
        return 2.0 * m * k * n
    if kind == "sdpa":
        t, heads, head_dim, keys, backward = dims
        return 2 * 2.0 * heads * head_dim * t * keys * (3 if backward else 1)
    t, vocab = dims
    return float(t * vocab)


def _kernel(shape: Shape, device, dtype, gen):
    """The kernel of `shape` as a function to time, its inputs made."""
    import torch

    def rand(*size, grad=False):
        return torch.randn(*size, generator=gen).to(device, dtype).requires_grad_(grad)

    kind, *dims = shape
    if kind == "mm":
        m, k, n = dims
        a, b = rand(m, k), rand(k, n)
        c = torch.mm(a, b)
        return lambda: torch.mm(a, b, out=c)
    if kind == "sdpa":
        t, heads, head_dim, keys, backward = dims
        q, k, v = rand(1, heads, t, head_dim, grad=bool(backward)), rand(1, heads, keys, head_dim), \
            rand(1, heads, keys, head_dim)
        docs = torch.arange(t, device=device) * 4 // t  # four documents, as packed micro-batches hold several
        if backward and torch.device(device).type == "cpu" and keys % t == 0:
            return _ttt_kernel(q, k, v, docs, keys // t)

        def attention():
            # speculators' sdpa path: an additive float mask (0 / -inf) over the T x keys scores, built from the
            # documents' ids and extended by a diagonal block at each TTT step, then the kernel
            cols, rows = torch.arange(keys, device=device) % t, torch.arange(t, device=device)
            same = (docs[:, None] == docs[cols][None, :]) & (cols[None, :] <= rows[:, None])
            mask = torch.zeros(t, keys, dtype=dtype, device=device).masked_fill_(~same, float("-inf"))
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask[None, None])
            if backward:
                out.sum().backward()
        return attention
    t, vocab = dims
    logits = rand(t, vocab, grad=True)
    target = torch.softmax(rand(t, vocab), -1)

    def loss():
        logp = torch.log_softmax(logits, -1)
        (torch.xlogy(target, target) - target * logp).sum().backward()
        logits.argmax(-1)
    return loss


def _ttt_kernel(q, k, v, docs, steps: int):
    """A draft's attention at one TTT step on CPU as it trains: speculators' boolean mask, extended by a diagonal
    block per step, computed by eagle3.arch.ttt_attention (the causal kernel per document and the diagonals)."""
    import torch

    from eagle3.arch.ttt_attention import plan_of, ttt_attention

    t = q.shape[2]
    rows = torch.arange(t, device=q.device)

    def attention():
        first = (docs[:, None] == docs[None, :]) & (rows[None, :] <= rows[:, None])
        mask = torch.cat([first, *[torch.eye(t, dtype=torch.bool, device=q.device)] * (steps - 1)], -1)[None, None]
        plan = plan_of(mask, t, steps * t)
        assert plan is not None
        ttt_attention(q, k, v, plan, q.shape[-1] ** -0.5).sum().backward()
    return attention


def device_name(device_type: str) -> str:
    """The CPU's model name (/proc/cpuinfo), or the GPU's (torch.cuda)."""
    if device_type == "cuda":
        import torch

        return torch.cuda.get_device_name()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown cpu"


def machine_key(device_type: str) -> str:
    """What the rate depends on: the device's model, torch's threads (CPU) and torch's version."""
    import torch

    threads = f"{torch.get_num_threads()} threads" if device_type == "cpu" else "gpu 0"
    return f"{device_type}: {device_name(device_type)}, {threads}, torch {torch.__version__}, kernels v{KERNELS}"


def cache_file(cache_dir: Path, key: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "-", key).strip("-")[:60]
    return Path(cache_dir) / "roofline" / f"{slug}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


@dataclass
class Rates:
    """The cached rates of one machine: FLOP/s per shape key, and when they were measured."""

    key: str
    rates: dict[str, float]
    measured_at: str = ""
    file: Path | None = None

    @classmethod
    def load(cls, cache_dir: Path, key: str) -> Rates:
        """The cache of `key` (empty when absent or unreadable: it is measured again, never trusted half-read)."""
        file = cache_file(cache_dir, key)
        try:
            plain = json.loads(file.read_text())
            rates = {str(k): float(v) for k, v in plain["rates"].items() if float(v) > 0}
            if plain.get("key") != key:
                rates = {}
            return cls(key, rates, str(plain.get("measured_at", "")), file)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return cls(key, {}, "", file)

    def merge(self, measured: dict[str, float]) -> None:
        """Adds newly measured rates, keeping the higher of an old and a new one: on a shared machine a measurement
        is only ever slowed by others' work, so the best seen is the closest to what the machine does alone."""
        for key, rate in measured.items():
            self.rates[key] = max(rate, self.rates.get(key, 0.0))
        self.measured_at = time.strftime("%Y-%m-%d %H:%M", time.gmtime()) + " UTC"

    def save(self) -> None:
        """Written whole (a temporary file renamed over it); a cache that cannot be written is only not kept."""
        assert self.file is not None
        base = self.file.parent.parent  # the cache dir: nothing under it is written through a link
        try:
            make_dirs(base, self.file.parent)
            write_text(base, self.file, json.dumps({"key": self.key, "measured_at": self.measured_at,
                                                    "rates": self.rates}, indent=1))
        except OSError:
            pass


def measure(shapes: Iterable[Shape], device_type: str = "cpu", dtype: str = "float32",
            seconds: float = 0.05, min_reps: int = 2) -> dict[str, float]:
    """The rate of each kernel (nominal_flops per second): one untimed call, then calls until `seconds` are spent
    (at least `min_reps`); the best of the timed calls is kept (the sustained rate when nothing else runs)."""
    import torch

    device = torch.device(device_type)
    torch_dtype = getattr(torch, dtype)
    out: dict[str, float] = {}
    gen = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for shape in shapes:
        run = _kernel(shape, device, torch_dtype, gen)
        run()
        sync()
        best, spent, reps = float("inf"), 0.0, 0
        while reps < min_reps or spent < seconds:
            start = time.perf_counter()
            run()
            sync()
            took = time.perf_counter() - start
            best, spent, reps = min(best, took), spent + took, reps + 1
        out[shape_key(shape, dtype)] = nominal_flops(shape) / best
    return out


def rates_for(shapes: Iterable[Shape], cache_dir: Path, device_type: str, *, measure_missing: bool,
              seconds: float = 0.0) -> tuple[dict[Shape, float], str]:
    """The rates of `shapes` on this machine from its cache, the missing ones measured (and cached) when
    `measure_missing`; and where they came from, in words. Shapes neither cached nor measured are left out."""
    key = machine_key(device_type)
    cached = Rates.load(cache_dir, key)
    wanted = list(dict.fromkeys(shapes))
    missing = [s for s in wanted if shape_key(s) not in cached.rates]
    measured_now = bool(missing and measure_missing)
    if measured_now:
        cached.merge(measure(missing, device_type, seconds=seconds, min_reps=1))  # one call each after a warm-up
        cached.save()
    rates = {s: cached.rates[shape_key(s)] for s in wanted if shape_key(s) in cached.rates}
    where = f"{key}, cached in {cached.file}"
    if measured_now:
        source = f"measured now at {len(missing)} of the step's shapes ({where})"
    else:
        source = f"measured {cached.measured_at or 'earlier'} ({where})"
    return rates, source


def regeneration_key(engine: str, verifier_hash: str) -> str:
    """The cache's entry for regeneration's measured tokens/s with `engine` on the verifier of `verifier_hash`."""
    return f"regenerate:{engine}:{verifier_hash}"


def record_rate(cache_dir: Path, device_type: str, key: str, rate: float) -> None:
    """Adds one measured rate (a regeneration's tokens/s) to this machine's cache."""
    rates = Rates.load(cache_dir, machine_key(device_type))
    rates.rates[key] = rate  # the latest: a regeneration's rate depends on its prompts and budget too
    rates.save()


def cached_rate(cache_dir: Path, device_type: str, key: str) -> tuple[float | None, str]:
    """A rate from this machine's cache, and the file it is in (None when not measured yet)."""
    rates = Rates.load(cache_dir, machine_key(device_type))
    return rates.rates.get(key), str(rates.file)
