"""A verifier's forward for hidden states: running a loaded causal LM (eagle3.verifier.model.Verifier.load) over rows
to write each row's aux-layer hidden states (plus the last layer's, before the final norm) as speculators'
`hs_<i>.safetensors` files. Used by data preparation, the synthetic data, and acceptance measurement.

The aux slots are Hugging Face `output_hidden_states[i]` (the residual stream entering decoder layer i,
which is what vLLM's extract_hidden_states captures); the last slot is the final layer's output before
the final norm, because speculators applies the verifier's norm itself. Both are taken by hooks on the layers'
and the norm's inputs (`hidden_state_taps`), for preparation, online data and acceptance measurement alike.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from eagle3.errors import ConfigError
from eagle3.formats.row_formats import Row

log = logging.getLogger(__name__)


def padded_batch(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of `seqs`, right-padded to the longest: causal attention keeps every real
    position's values exact, whatever follows it."""
    width = max(len(seq) for seq in seqs)
    ids = torch.zeros(len(seqs), width, dtype=torch.long)
    attn = torch.zeros_like(ids)
    for b, seq in enumerate(seqs):
        ids[b, :len(seq)] = torch.from_numpy(np.array(seq, dtype=np.int64))  # a copy: Arrow rows are read-only
        attn[b, :len(seq)] = 1
    return ids, attn


# The attention kinds transformers' masks confine to a packed row's documents: the documents are found from
# position_ids restarting at 0, and each layer's mask keeps its sliding window (if any) within its document.
# Chunked attention counts its chunks from the row's start, and recurrent layers carry state across documents.
PACKABLE_ATTENTION = ("full_attention", "sliding_attention")


def packing_problem(config) -> str | None:
    """Why documents packed into one row would not each get their own forward's values in a model of `config`
    (a transformers config), or None: layers whose attention a per-document mask cannot confine."""
    text = config.get_text_config()
    kinds = set(getattr(text, "layer_types", None) or ())
    if not kinds and getattr(text, "attention_chunk_size", None) is not None:
        kinds = {"chunked_attention"}
    other = sorted(kinds - set(PACKABLE_ATTENTION))
    if other:
        return (f"its layers' attention includes {', '.join(other)}, which a packed row's per-document mask cannot "
                f"confine (data=online packs documents; {' and '.join(PACKABLE_ATTENTION)} only); "
                f"prepare its hidden states offline with eagle3 prepare and use data=offline")
    return None


def packed_batch(seqs: Sequence[Sequence[int]], model: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """`seqs` packed into one row on `model`'s device: (input_ids [1, L], position_ids [1, L] restarting at 0 for
    each sequence, the model's attention masks over it). The masks are transformers' own for the model's config
    (one, or one per layer kind: full and sliding-window), built from position_ids, so each position sees only the
    earlier positions of its own sequence within its layer's window. A forward over it gives each sequence's values
    as its own forward would, at the cost of L tokens, not of len(seqs) x the longest."""
    from transformers.masking_utils import create_masks_for_generate

    parameter = next(model.parameters())
    lengths = torch.tensor([len(seq) for seq in seqs])
    ids = torch.from_numpy(np.concatenate([np.asarray(seq, dtype=np.int64) for seq in seqs]))[None]
    starts = torch.repeat_interleave(torch.cumsum(lengths, 0) - lengths, lengths)
    position_ids = (torch.arange(ids.shape[1]) - starts)[None].to(parameter.device)
    # The masks need only the embeddings' shape, dtype and device: an empty [1, L, 0] stands for them.
    shape = torch.empty(1, ids.shape[1], 0, dtype=parameter.dtype, device=parameter.device)
    masks = create_masks_for_generate(model.config, shape, attention_mask=None, past_key_values=None,
                                      position_ids=position_ids)
    return ids.to(parameter.device), position_ids, masks


def forward_hidden_states(model: torch.nn.Module, ids: torch.Tensor, attn: torch.Tensor | dict | None,
                          taps: dict[int | str, torch.Tensor],
                          position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """[B, T, n_aux + 1, H] on the model's device and in its dtype: the aux layers' inputs, then the last layer's
    output before the final norm (`taps`: what `hidden_state_taps` collects). `attn`: a padding mask [B, T], or
    packed_batch's masks with its position_ids. Runs the decoder only, without a KV cache: the
    lm_head's logits (vocabulary x tokens) are never computed."""
    device = next(model.parameters()).device
    taps.clear()
    if isinstance(attn, torch.Tensor):
        attn = attn.to(device)
    model.get_decoder()(input_ids=ids.to(device), attention_mask=attn, use_cache=False,
                        position_ids=None if position_ids is None else position_ids.to(device))
    return torch.stack([taps[i] for i in sorted(k for k in taps if isinstance(k, int))] + [taps["last"]], dim=2)


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
    from safetensors.torch import save_file

    from eagle3.safe_write import fresh_temp, refuse_links

    todo = rows_to_write(rows, hs_dir, len(aux_layer_ids) + 1, model.config.hidden_size, dtype)
    batches = [b for b in batch_plan([len(ids) for ids, _ in rows], batch_tokens) if todo.intersection(b)]
    with hidden_state_taps(model, aux_layer_ids) as taps:
        with tqdm(total=len(todo), desc="verifier hidden states", unit="row", dynamic_ncols=True) as bar:
            for batch in batches:
                lengths = [len(rows[i][0]) for i in batch]
                ids, attn = padded_batch([rows[i][0] for i in batch])
                stacked = forward_hidden_states(model, ids, attn, taps).to("cpu", dtype)
                for b, i in enumerate(batch):
                    if i in todo:
                        file = hs_dir / f"hs_{i}.safetensors"
                        # renamed into place: never half a file, never through a link
                        tmp = fresh_temp(hs_dir, file.with_name(f".{file.name}.tmp"))
                        refuse_links(hs_dir, file)
                        try:
                            save_file({"hidden_states": stacked[b, :lengths[b]].contiguous(),
                                       "token_ids": ids[b, :lengths[b]].clone()}, str(tmp))
                        except BaseException:  # a full disk, a signal: no half file is left behind
                            tmp.unlink(missing_ok=True)
                            raise
                        os.replace(tmp, file)
                        bar.update()
    return len(todo)


def rows_to_write(rows: Sequence[Row], hs_dir: Path, slots: int, hidden_size: int, dtype: torch.dtype) -> set[int]:
    """The rows whose `hs_<i>.safetensors` in `hs_dir` (made here if missing) is missing or unusable; the others
    are kept (a resumed preparation), which is logged."""
    from eagle3.formats.hidden_states import DTYPE_NAMES, hidden_state_problem

    hs_dir.mkdir(parents=True, exist_ok=True)
    todo = {i for i, (ids, _) in enumerate(tqdm(rows, desc="checking existing hidden states", unit="row",
                                                leave=False, mininterval=1.0))
            if hidden_state_problem(hs_dir / f"hs_{i}.safetensors", np.asarray(ids, dtype=np.int64), slots,
                                    hidden_size, DTYPE_NAMES[dtype])}
    if len(todo) < len(rows):
        log.info("%d of %d hidden-state files are already there and valid: kept", len(rows) - len(todo), len(rows))
    return todo


@contextmanager
def hidden_state_taps(model: torch.nn.Module, aux_layer_ids: Sequence[int]) -> Iterator[dict[int | str, torch.Tensor]]:
    """Collects, at every forward, the input of decoder layer i for each aux id (Hugging Face's
    output_hidden_states[i], the residual stream entering layer i, what vLLM captures) under the key `position of i
    in aux_layer_ids`, and the input of the final norm under "last" (the last layer's output before the norm,
    speculators' last slot; Hugging Face's last hidden state is after it). Hooks rather than output_hidden_states:
    no tuple of every layer's output is kept, and they also work on layers that FSDP2 wraps."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    norm, layers = getattr(decoder, "norm", None), getattr(decoder, "layers", None)
    if norm is None or layers is None:
        raise ConfigError(f"{type(model).__name__}: no decoder layers and final norm at model.get_decoder().layers "
                          f"and .norm, so its hidden states cannot be captured (Llama-style decoders have them)")
    taps: dict[int | str, torch.Tensor] = {}

    def tap(key: int | str):
        def hook(_module, args, kwargs):
            taps[key] = args[0] if args else kwargs["hidden_states"]
        return hook

    hooks = [layers[i].register_forward_pre_hook(tap(k), with_kwargs=True) for k, i in enumerate(aux_layer_ids)]
    hooks.append(norm.register_forward_pre_hook(tap("last"), with_kwargs=True))
    try:
        yield taps
    finally:
        for hook in hooks:
            hook.remove()
