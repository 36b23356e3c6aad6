"""A verifier from a GGUF file (llama.cpp's format): transformers reads the file (the `gguf` package de-quantizes
its tensors), and the model is written again as an fp32 safetensors dir with its tokenizer and chat template, which
transformers, vLLM and eagle3 load like any Hugging Face model dir.

transformers' `save_pretrained` refuses a model loaded from GGUF (its config carries a GGUF `quantization_config`),
so the model class is built anew from the config without it, and the de-quantized weights are loaded into it (every
key must match). The dir is written into a temporary sibling and renamed into place whole; an existing OUT is
never overwritten.
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import time
from pathlib import Path

from eagle3.config import path_kind
from eagle3.errors import ConfigError, DataError

MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def check_paths(file: Path, out: Path) -> None:
    """Refuses (one message) a FILE that is not a readable GGUF file, and an OUT that exists or cannot be written."""
    if not file.is_file():
        exists = file.exists() or file.is_symlink()
        raise ConfigError(f"{file} {path_kind(file, 'a GGUF file')}" if exists else f"{file}: no such file")
    try:
        with file.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ConfigError(f"{file}: cannot be read ({e.strerror or e})") from None
    if magic != MAGIC:
        raise DataError(f"{file}: not a GGUF file (it does not start with {MAGIC!r})")
    if out.exists() or out.is_symlink():
        raise ConfigError(f"{out} exists and is not overwritten; give a new directory")
    parent = out.absolute().parent
    if not parent.is_dir():
        raise ConfigError(f"{parent}: no such directory, so {out.name} cannot be written in it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{parent}: not writable, so {out.name} cannot be written in it")


def from_gguf(file: Path, out: Path, say=None) -> Path:
    """Writes the GGUF model at `file` to the new dir `out` (fp32 safetensors + tokenizer); returns `out`.
    `say` reports each long step (default: a line on stderr)."""
    file, out = Path(file), Path(out)
    check_paths(file, out)
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    tmp = out.absolute().with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        convert(file, tmp, say)
        if out.exists():  # made meanwhile by someone else: theirs is kept
            raise ConfigError(f"{out} appeared while converting and is not overwritten")
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say(f"done: {out}")  # the dir's own name, once it is whole (convert wrote the temporary one)
    return out


def cut_short(file: Path, where: str) -> str:
    return (f"{file}: the file ends at byte {file.stat().st_size:,}, {where}: it was cut short (an interrupted "
            f"download or copy?); fetch it again")


def check_whole(file: Path) -> None:
    """Refuses a GGUF file that ends before its header does or before the tensor data its header describes,
    read by transformers' own GGUF reader (where this transformers has it: otherwise its loading says it)."""
    try:
        from transformers.integrations.gguf.reader import GgufHeader
    except ImportError:
        return
    try:
        header = GgufHeader.from_file(str(file))
    except struct.error:
        raise DataError(cut_short(file, "inside its header")) from None
    except Exception:  # noqa: BLE001  (what else it cannot read, the loading says in its own words)
        return
    end = header.data_start + max((t.offset + t.nbytes for t in header.tensors), default=0)
    if file.stat().st_size < end:
        raise DataError(cut_short(file, f"inside its tensor data (its header says they end at byte {end:,})"))


def convert(file: Path, out: Path, say) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()

    def step(what: str) -> None:
        say(f"[{time.perf_counter() - start:6.1f} s] {what}")

    step(f"reading {file} ({file.stat().st_size / 2**20:.0f} MiB) and de-quantizing its tensors")
    check_whole(file)
    directory, name = str(file.absolute().parent), file.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name)
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=name, dtype=torch.float32)
    except ImportError as e:
        raise ConfigError(f"reading GGUF files needs the gguf and accelerate packages ({e})") from None
    except struct.error:  # a header read past the end of the file
        raise DataError(cut_short(file, "inside its header")) from None
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise DataError(f"{file}: transformers cannot read this GGUF file ({str(e).splitlines()[0][:300]})") from None
    step(f"building {type(loaded).__name__} without the GGUF quantization config")
    config_dict = {k: v for k, v in loaded.config.to_dict().items() if k != "quantization_config"}
    config = type(loaded.config).from_dict(config_dict)
    config.dtype = "float32"
    model = type(loaded)(config).float()
    result = model.load_state_dict(loaded.state_dict(), strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise DataError(f"{file}: the de-quantized weights do not fit {type(loaded).__name__} (missing "
                        f"{result.missing_keys[:5]}, unexpected {result.unexpected_keys[:5]})")
    del loaded
    step(f"writing {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M fp32 parameters and the tokenizer")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if not tokenizer.chat_template:
        step("note: the GGUF file has no chat template; messages rows cannot be rendered with this verifier")
