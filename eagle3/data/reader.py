"""Packed, EAGLE-3-shifted micro-batches read from speculators' hidden-state files with one copy per byte.

speculators' reader memory-maps each file (safetensors `load_file`), copies the aux slots out of it
(`hidden_states[:, :-1].flatten(1)`), and its CollateFn copies every sample again into freshly allocated,
zero-filled buffers, with page faults on the map and on every fresh buffer: 0.13 of the page cache's
read rate in bench/loader.py.
This reader `preadv`s each file's hidden-state bytes, at the tensor's offset from the safetensors header,
straight into a batch buffer that is reused, and lays them out so that speculators' batch is two views:

    buffer [T + 1, n_aux + 1, H], the files' dtype. Document s (file rows 0..n-1), packed at position q_s,
    takes r_s = min(n - 1, T - q_s) positions (a pack that overflows T is cut there, as CollateFn cuts it):
        buffer[q_s : q_s + r_s]      = file rows 0 .. r_s - 1, all slots     (one read per document)
        buffer[q_s + r_s, last slot] = file row r_s, last slot              (after every document's big read)
    hidden_states               = buffer[:T, :n_aux]     as [1, T, n_aux * H]  (document position i: file row i)
    verifier_last_hidden_states = buffer[1:T + 1, n_aux] as [1, T, H]          (document position i: file row i + 1)

which is shift_batch + CollateFn exactly: position i of a document holds input_ids[i + 1], loss_mask[i + 1],
position_ids i + 1, its document index; after the last document, zeros and document id -1. The buffer goes
to the device in one copy and is split there (`split_hidden`); a non-contiguous view would be copied on the
host first.
"""

from __future__ import annotations

import os
import queue
import threading
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eagle3.formats.arrow_rows import ArrowRows
from eagle3.formats.hidden_states import check_file, hs_path, open_file, read_into


def split_hidden(buffer: torch.Tensor) -> dict[str, torch.Tensor]:
    """The model's hidden-state inputs as views of a micro-batch's buffer (see the module doc); no copy."""
    t, slots, h = buffer.shape[0] - 1, buffer.shape[1], buffer.shape[2]
    return {"hidden_states": buffer[:t, :slots - 1].view(1, t, (slots - 1) * h),
            "verifier_last_hidden_states": buffer[1:, slots - 1].unsqueeze(0)}


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, torch.Tensor]:
    """The model's inputs from a micro-batch: its tensors on `device`; the reader's hidden-state buffer goes in
    one copy and is split there into hidden_states and verifier_last_hidden_states (views), in the compute
    dtype: float32 on CPU (no autocast there), the files' bf16 on CUDA (under bf16 autocast)."""
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()
           if isinstance(v, torch.Tensor) and k != "hidden_buffer"}
    if "hidden_buffer" in batch:
        dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
        views = split_hidden(batch["hidden_buffer"].to(device, non_blocking=True))
        out.update({k: v.to(dtype) for k, v in views.items()})
    return out


class Pack:
    """Where the documents of one micro-batch go (see the module doc), and its small tensors.

    `pieces`: (dataset row, position q_s, positions r_s) per document, in order; its hidden states fill the buffer
    at q_s .. q_s + r_s - 1 (all slots, the row's first r_s positions) and at q_s + r_s (last slot only, row
    position r_s), the latter after every document's big part. `end`: the positions filled."""

    def __init__(self, rows: ArrowRows, split_rows: Sequence[int], docs: Sequence[int], total_seq_len: int):
        t = total_seq_len
        self.small = {k: np.zeros(t, np.int64) for k in ("input_ids", "loss_mask", "position_ids")}
        self.small["document_ids"] = np.full(t, -1, np.int64)
        self.pieces: list[tuple[int, int, int]] = []
        q = 0
        for s, i in enumerate(docs):
            if q >= t:
                break
            row = int(split_rows[i])
            ids = rows.input_ids(row)
            r = max(0, min(len(ids) - 1, t - q))
            self.small["input_ids"][q:q + r] = ids[1:r + 1]
            self.small["loss_mask"][q:q + r] = rows.loss_mask(row)[1:r + 1]
            self.small["position_ids"][q:q + r] = np.arange(1, r + 1)
            self.small["document_ids"][q:q + r] = s
            self.pieces.append((row, q, r))
            q += r
        self.end = q

    def batch(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """The micro-batch, once `buf` holds the pieces' hidden states: the rest of the buffer zeroed."""
        buf[self.end + 1:].zero_()
        buf[self.end, :-1].zero_()  # buf[end, last slot] is the last document's tail
        return {"hidden_buffer": buf, **{k: torch.from_numpy(v)[None] for k, v in self.small.items()}}


class PackedLoader:
    """This rank's packed micro-batches of one split, in `batch_sampler`'s order.

    A micro-batch is a dict: "hidden_buffer" [T + 1, n_aux + 1, H] (see the module doc) and "input_ids",
    "loss_mask", "position_ids", "document_ids" [1, T] int64. One thread reads `prefetch` micro-batches
    ahead into a ring of prefetch + 1 buffers, allocated once (page-locked for a CUDA consumer) and reused,
    so no batch pays for fresh pages. A buffer is valid until the next micro-batch is requested; on CUDA it
    is refilled only after the GPU finished what was queued before that request (the copy from it).
    Starting a new pass over the loader ends the previous one.
    """

    def __init__(self, data_dir: Path, rows: ArrowRows, split_rows: Sequence[int], batch_sampler,
                 total_seq_len: int, hidden_size: int, num_aux_layers: int, dtype: torch.dtype, prefetch: int,
                 device: torch.device):
        self.data_dir, self.rows, self.split_rows = Path(data_dir), rows, split_rows
        self.batch_sampler = batch_sampler
        self.total_seq_len, self.hidden_size, self.num_aux = total_seq_len, hidden_size, num_aux_layers
        self.dtype, self.prefetch, self.device = dtype, prefetch, device
        self.ring: list[tuple[torch.Tensor, memoryview]] = []
        self._active: weakref.ref[_Pass] | None = None

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> _Pass:
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()  # its thread may still be filling the ring this pass is about to use
        if not self.ring:
            for _ in range(self.prefetch + 1):
                buf = torch.empty((self.total_seq_len + 1, self.num_aux + 1, self.hidden_size), dtype=self.dtype,
                                  pin_memory=self.device.type == "cuda")
                self.ring.append((buf, memoryview(buf.view(-1).view(torch.uint8).numpy())))
        p = _Pass(self._fill, self.ring, list(self.batch_sampler), self.device)
        self._active = weakref.ref(p)
        return p

    def _fill(self, buf: torch.Tensor, raw: memoryview, docs: Sequence[int]) -> dict[str, torch.Tensor]:
        """Reads one pack into `buf` (in the reader thread) and returns its micro-batch."""
        slots, h = self.num_aux + 1, self.hidden_size
        item, row_bytes = buf.element_size() * h, buf.element_size() * h * slots
        pack = Pack(self.rows, self.split_rows, docs, self.total_seq_len)
        fds, tails = [], []
        try:
            for row, q, r in pack.pieces:
                path = hs_path(self.data_dir, row)
                fds.append(open_file(path, row))
                start = check_file(fds[-1], path, row, self.rows.input_ids(row), self.dtype, self.num_aux, h)
                read_into(fds[-1], raw[q * row_bytes:(q + r) * row_bytes], start, path)
                if r:
                    tails.append((fds[-1], path, start + r * row_bytes + self.num_aux * item, q + r))
            # Last: each tail lands on the first row of the next document's big read.
            for fd, path, offset, p in tails:
                read_into(fd, raw[p * row_bytes + self.num_aux * item:(p + 1) * row_bytes], offset, path)
        finally:
            for fd in fds:
                os.close(fd)
        return pack.batch(buf)

    def check_row(self, row: int) -> None:
        """Checks one row's file against the row and the draft's shape, as every read does."""
        path = hs_path(self.data_dir, row)
        fd = open_file(path, row)
        try:
            check_file(fd, path, row, self.rows.input_ids(row), self.dtype, self.num_aux, self.hidden_size)
        finally:
            os.close(fd)


class _Pass:
    """One pass over a PackedLoader: hands out micro-batches a reader thread fills ahead into the ring."""

    def __init__(self, fill: Callable, ring: list, plan: list, device: torch.device):
        self.remaining, self.device, self.held, self.closed = len(plan), device, None, False
        self.free: queue.SimpleQueue = queue.SimpleQueue()  # (slot, CUDA event to wait for) or None: stop
        self.ready: queue.SimpleQueue = queue.SimpleQueue()  # (slot, micro-batch) or the reader's exception
        self.stop = threading.Event()
        for k in range(len(ring)):
            self.free.put((k, None))
        # The thread must not reference this object, so that dropping the pass closes it.
        self.thread = threading.Thread(target=_read_ahead, args=(fill, ring, plan, self.free, self.ready, self.stop),
                                       name="eagle3-reader", daemon=True)
        self.thread.start()

    def __iter__(self) -> _Pass:
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if self.held is not None:  # the consumer is done with it: hand it back before waiting
            copied = None
            if self.device.type == "cuda":
                copied = torch.cuda.Event()
                copied.record(torch.cuda.current_stream(self.device))
            self.free.put((self.held, copied))
            self.held = None
        if self.remaining == 0:
            self.close()
            raise StopIteration
        item = self.ready.get()
        if isinstance(item, BaseException):
            self.close()
            raise item
        self.remaining -= 1
        self.held, batch = item
        return batch

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.stop.set()
            self.free.put(None)
            self.thread.join()

    def __del__(self) -> None:
        self.close()


def _read_ahead(fill: Callable, ring: list, plan: list, free: queue.SimpleQueue, ready: queue.SimpleQueue,
                stop: threading.Event) -> None:
    for docs in plan:
        slot = free.get()
        if stop.is_set():
            return
        k, copied = slot
        if copied is not None:
            copied.synchronize()
        try:
            ready.put((k, fill(*ring[k], docs)))
        except Exception as e:  # noqa: BLE001  (raised in the consumer's thread)
            ready.put(e)
            return
