"""Runs INSIDE the vLLM engine's venv (eagle3.serve's environment), never in the project's: imports only the
standard library, torch, safetensors and vLLM. eagle3/data/vllm_hidden_states.py copies it into a directory of its
own, puts that on PYTHONPATH and runs it with the engine's interpreter on a job file (JSON):

    {"llm": {...LLM(**) keywords...}, "batches": [[[row, [token ids]], ...], ...], "write": [rows],
     "hs_dir": DIR, "progress": FILE, "columns": [...], "dtype": "float32"}

vLLM's `extract_hidden_states` speculative method puts the hidden states of the layers named by
`eagle_aux_hidden_state_layer_ids` into a cache of their own; a KV connector writes each request's to
`<spool>/<request id>.safetensors` ({"hidden_states": [tokens, len(ids), H], "token_ids": [tokens]}) when the
request finishes. Each batch's prompts go to the engine in one `generate` call (max_tokens 1), so a batch is
computed as one step whatever else ran before it; each file is then given its columns in the project's order
(`columns`) and dtype and renamed into place as `<hs_dir>/hs_<row>.safetensors` (whole or not at all), and its row
is appended to the progress file (after a first line, "ready", once the engine has started). A batch's rows
not in `write` are computed (a row's values can depend on its batch) and their files dropped.

On a CPU, vLLM's own connector (ExampleHiddenStatesConnector) cannot run: it copies through pinned memory on a
CUDA stream. CPUHiddenStatesConnector below (loaded by vLLM from this module, kv_connector_module_path) extracts
from the cache and saves synchronously instead.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys

import torch
from safetensors.torch import load_file, save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    extract_from_kv_cache,
)


class Written:
    """What the stock connector's get_finished polls (a CUDA event there): the file is already on disk."""

    @staticmethod
    def query() -> bool:
        return True


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector with its copy done in place: the request's slots of the hidden-state cache
    gathered on the CPU and saved before the request is reported done; its lock file released after the save."""

    def _submit_async_write(self, pending) -> None:
        if not self._is_tp_rank_zero:
            return
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (torch.arange(self._block_size, dtype=torch.long)[None] + blocks[:, None] * self._block_size)
        hidden = extract_from_kv_cache(self._kv_cache, slots.flatten(), pending.token_ids.shape[0]).clone()
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        try:
            save_file({"hidden_states": hidden, "token_ids": pending.token_ids.clone()}, pending.filename)
        finally:
            lock = self._lock_fds.pop(pending.req_id, None)
            if lock is not None:
                os.close(lock)  # releases the exclusive lock wait_for_save took
        self._req_copy_events[pending.req_id] = Written()


def wait_written(path: str, step) -> None:
    """Waits until the connector has written `path` (it holds an exclusive lock on `path.lock` from before the
    request runs until the file is written), then removes the lock file. The connector saves a request's states at
    the engine step after the one that finished it: an engine core in another process keeps stepping while saves
    are pending, one in this process (the CPU's) steps only when asked, so `step` (None for the former) is called
    until the lock is free."""
    lock = path + ".lock"
    with open(lock) as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | (fcntl.LOCK_NB if step else 0))
                break
            except BlockingIOError:
                step()
    os.remove(lock)


def place(spooled: str, final: str, columns: list[int], dtype: torch.dtype) -> None:
    """The engine's file as `final`: as it is when its columns and dtype are already the project's, else
    rewritten; renamed into place, so `final` is whole or absent."""
    tensors = load_file(spooled)
    hidden = tensors["hidden_states"]
    if columns != list(range(hidden.shape[1])) or hidden.dtype != dtype or tensors["token_ids"].dtype != torch.long:
        tmp = spooled + ".tmp"
        save_file({"hidden_states": hidden[:, columns].to(dtype).contiguous(),
                   "token_ids": tensors["token_ids"].to(torch.long)}, tmp)
        os.replace(tmp, spooled)
    os.replace(spooled, final)


def run(job: dict) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.v1.engine.core_client import InprocClient

    llm = LLM(**job["llm"])
    engine = llm.llm_engine
    step = engine.step if isinstance(engine.engine_core, InprocClient) else None
    dtype, write = getattr(torch, job["dtype"]), set(job["write"])
    with open(job["progress"], "a") as progress:
        progress.write("ready\n")
        progress.flush()
        params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
        for batch in job["batches"]:
            prompts = [TokensPrompt(prompt_token_ids=ids) for _, ids in batch]
            outputs = llm.generate(prompts, params, use_tqdm=False)
            for (row, _), output in zip(batch, outputs, strict=True):
                path = (output.kv_transfer_params or {}).get("hidden_states_path")
                if path is None:
                    raise RuntimeError(f"row {row}: the engine's output names no hidden-states file "
                                       f"({output.kv_transfer_params}); is the KV connector configured?")
                wait_written(path, step)
                if row in write:
                    place(path, os.path.join(job["hs_dir"], f"hs_{row}.safetensors"), job["columns"], dtype)
                    progress.write(f"{row}\n")
                else:  # valid already: computed again only for its batch's sake
                    os.remove(path)
            progress.flush()


if __name__ == "__main__":  # vLLM may start its workers by spawn, which imports this module again
    with open(sys.argv[1]) as f:
        run(json.load(f))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # every file is in place: vLLM's teardown (10 s and more on a CPU) does nothing for them
