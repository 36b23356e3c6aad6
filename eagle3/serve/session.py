"""One server's measurement: the prompts as token ids, one request at a time, at a temperature; the generated
tokens, the time the requests took, and the spec-decode counters around each request (a per-prompt breakdown
for free, since requests do not overlap)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from typing import Any

from tqdm import tqdm

from eagle3.engine.server import SERVED_NAME, Server
from eagle3.errors import EngineError
from eagle3.serve.metrics import spec_counters


def complete(server: Server, prompt: Sequence[int], max_new_tokens: int, temperature: float, seed: int) -> list[int]:
    """The continuation's token ids: exactly `max_new_tokens`, through any end-of-sequence token, as eagle3.eval
    decodes. `ignore_eos` alone: vLLM's `min_tokens` would also mask the end-of-sequence tokens until that many are
    made, so where the verifier's best token is one (a short answer's end) the engine would take its second best."""
    body = {"model": SERVED_NAME, "prompt": list(prompt), "max_tokens": max_new_tokens, "temperature": temperature,
            "seed": seed, "ignore_eos": True, "return_token_ids": True, "detokenize": False}
    answer = server.post("/v1/completions", body)
    try:
        return [int(t) for t in answer["choices"][0]["token_ids"]]
    except (KeyError, IndexError, TypeError, ValueError):
        raise EngineError(f"the vLLM server's completion has no token_ids: {str(answer)[:300]}; its log: "
                          f"{server.log}") from None


def measure(servers: dict[str, Server], prompts: Sequence[Sequence[int]], max_new_tokens: int,
            temperature: float, seed: int, between: Callable[[], object] | None = None) -> dict[str, dict[str, Any]]:
    """Per server: {"tokens": per prompt, "counters": totals, "per_prompt": counters per prompt,
    "tokens_generated", "seconds" (per request), "request_s", "tokens_per_s", "cpu_s", "tokens_per_cpu_s"}
    (cpu_s: the server's processes' CPU time over its requests), "turn_tokens_per_s" (per request). The servers take
    turns prompt by prompt, so that a machine busier in one minute than in the next slows them alike, and in an
    order that turns around from one prompt to the next (plain, spec; spec, plain; ...), so that none is always
    the one served right after `between` or right after another's request; each first gets one short warm-up
    request, which the counters leave out. `between` runs after each prompt's turn, while no request is served
    (eagle3.serve times the draft forward there)."""
    for server in servers.values():
        complete(server, prompts[0], min(8, max_new_tokens), temperature, seed)
    last = {name: spec_counters(server.get("/metrics")) for name, server in servers.items()}
    first = dict(last)
    out: dict[str, dict[str, Any]] = {name: {"tokens": [], "per_prompt": [], "seconds": [],
                                             "cpu_s": 0.0} for name in servers}
    names = list(servers)
    made, served_s = 0, 0.0
    bar = tqdm(total=len(prompts), desc=f"serving ({', '.join(names)})", unit="prompt", leave=False,
               file=sys.stderr, mininterval=1.0)
    for i, prompt in enumerate(prompts):
        for name in names if i % 2 == 0 else names[::-1]:
            server = servers[name]
            start, cpu = time.perf_counter(), server.cpu_s()
            out[name]["tokens"].append(complete(server, prompt, max_new_tokens, temperature, seed))
            out[name]["seconds"].append(time.perf_counter() - start)
            made, served_s = made + len(out[name]["tokens"][-1]), served_s + out[name]["seconds"][-1]
            out[name]["cpu_s"] += server.cpu_s() - cpu
            now = spec_counters(server.get("/metrics"))
            out[name]["per_prompt"].append(asdict(now - last[name]))
            last[name] = now
        if between is not None:
            between()
        bar.set_postfix_str(f"{made / served_s:.1f} tokens/s", refresh=False)  # over all the servers' requests
        bar.update()
    bar.close()
    for name, r in out.items():
        r["counters"] = last[name] - first[name]
        r["tokens_generated"] = sum(len(t) for t in r["tokens"])
        r["request_s"] = sum(r["seconds"])
        r["tokens_per_s"] = r["tokens_generated"] / r["request_s"]
        r["tokens_per_cpu_s"] = r["tokens_generated"] / r["cpu_s"]
        r["turn_tokens_per_s"] = [len(t) / s for t, s in zip(r["tokens"], r["seconds"])]
    return out
