"""A verifier's forward for hidden states: loading a local Hugging Face causal LM, and running it over rows to
write each row's aux-layer hidden states (plus the last layer's, before the final norm) as speculators'
`hs_<i>.safetensors` files. Used by data preparation, the synthetic data, and acceptance measurement.

The aux slots are Hugging Face `output_hidden_states[i]` (the residual stream entering decoder layer i,
which is what vLLM's extract_hidden_states captures); the last slot is the final layer's output before
the final norm, because speculators applies the verifier's norm itself.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm import tqdm

from eagle3.data.jsonl import Row
from eagle3.errors import ConfigError

log = logging.getLogger(__name__)


def load_causal_lm(model_dir: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype)
    return model.to(device).eval()


def batch_plan(lengths: Sequence[int], batch_tokens: int) -> list[list[int]]:
    """Row indices grouped into forward batches of at most `batch_tokens` padded tokens, longest rows first.
    It depends only on the lengths, so a resumed preparation recomputes each row in the same batch as the
    first attempt did, and its files come out bit-identical."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@torch.no_grad()
def write_hidden_states(model: torch.nn.Module, rows: Sequence[Row], hs_dir: Path, aux_layer_ids: Sequence[int],
                        batch_tokens: int, dtype: torch.dtype) -> int:
    """`hs_<i>.safetensors` for every row whose file is missing or unusable; returns how many were written."""
    import numpy as np
    from safetensors.torch import save_file

    from eagle3.data.check import hidden_state_problem
    from eagle3.data.hsfiles import DTYPE_NAMES

    hs_dir.mkdir(parents=True, exist_ok=True)
    slots, hidden, dtype_name = len(aux_layer_ids) + 1, model.config.hidden_size, DTYPE_NAMES[dtype]
    todo = {i for i, (ids, _) in enumerate(tqdm(rows, desc="checking existing hidden states", unit="row",
                                                leave=False, mininterval=1.0))
            if hidden_state_problem(hs_dir / f"hs_{i}.safetensors", np.asarray(ids, dtype=np.int64), slots,
                                    hidden, dtype_name)}
    batches = [b for b in batch_plan([len(ids) for ids, _ in rows], batch_tokens) if todo.intersection(b)]
    if len(todo) < len(rows):
        log.info("%d of %d hidden-state files are already there and valid: kept", len(rows) - len(todo), len(rows))
    device = next(model.parameters()).device
    with pre_final_norm(model) as pre_norm:
        with tqdm(total=len(todo), desc="verifier hidden states", unit="row", dynamic_ncols=True) as bar:
            for batch in batches:
                lengths = [len(rows[i][0]) for i in batch]
                ids = torch.zeros(len(batch), max(lengths), dtype=torch.long)
                attn = torch.zeros_like(ids)
                for b, i in enumerate(batch):  # right padding: causal attention keeps real positions exact
                    ids[b, :lengths[b]] = torch.tensor(rows[i][0])
                    attn[b, :lengths[b]] = 1
                pre_norm.clear()
                out = model(input_ids=ids.to(device), attention_mask=attn.to(device), output_hidden_states=True)
                layers = [out.hidden_states[i] for i in aux_layer_ids] + [pre_norm[-1]]
                stacked = torch.stack(layers, dim=2).to("cpu", dtype)  # [B, T, n_aux + 1, H]
                for b, i in enumerate(batch):
                    if i in todo:
                        file = hs_dir / f"hs_{i}.safetensors"
                        tmp = file.with_name(f".{file.name}.tmp")  # renamed into place: never half a file
                        save_file({"hidden_states": stacked[b, :lengths[b]].contiguous(),
                                   "token_ids": ids[b, :lengths[b]].clone()}, str(tmp))
                        os.replace(tmp, file)
                        bar.update()
    return len(todo)


@contextmanager
def pre_final_norm(model: torch.nn.Module) -> Iterator[list[torch.Tensor]]:
    """Collects the input of the model's final norm at every forward: the last layer's output before the norm,
    the verifier's last slot in speculators' format (Hugging Face's last hidden state is after the norm)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    norm = getattr(decoder, "norm", None)
    if norm is None:
        raise ConfigError(f"{type(model).__name__}: no final norm found at model.get_decoder().norm, so the last "
                          f"layer's pre-norm output cannot be captured (Llama-style decoders have one)")
    captured: list[torch.Tensor] = []
    hook = norm.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    try:
        yield captured
    finally:
        hook.remove()
