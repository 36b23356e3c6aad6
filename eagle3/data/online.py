"""Online data (data=online): the verifier runs inside the training loop and gives each micro-batch's hidden
states from its token rows alone, so no hidden state is stored.

A micro-batch is exactly the offline reader's (eagle3/data/reader.py): the same sampler, split and packing
(`Pack`), the same buffer layout, the hidden states rounded to data.hidden_states_dtype as offline files store
them. Only the source differs: a document packed at q_s with r_s positions needs the verifier's hidden states at
its positions 0 .. r_s, so the verifier runs over those r_s + 1 tokens of each document of the pack (one forward
per micro-batch, the documents packed into one row with per-document masks, each layer's window kept: no padding),
in the loop's own thread: with data.shard_verifier the forward is a collective, and every rank must issue it
in the same order as the draft's own.

The verifier is loaded once per rank, eval mode, no grad: bf16 on CUDA, fp32 on CPU; a full copy on every rank, or
sharded across the ranks with FSDP2 (forward only; each rank keeps 1/world of its weights between forwards).
"""

from __future__ import annotations

import logging
import shutil
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch

from eagle3.config import DraftConfig
from eagle3.data.reader import Pack
from eagle3.device.choice import compute_dtype_on
from eagle3.device.distributed import World
from eagle3.errors import ConfigError
from eagle3.formats.arrow_rows import ArrowRows
from eagle3.safe_write import fresh_temp, make_dirs, replace_file
from eagle3.verifier.forward import forward_hidden_states, hidden_state_taps, packed_batch
from eagle3.verifier.model import Verifier

log = logging.getLogger(__name__)


class OnlineVerifier:
    """The verifier as a source of hidden states: [B, T, n_aux + 1, H] for a batch of token sequences."""

    def __init__(self, model: torch.nn.Module, aux_layer_ids: Sequence[int], sharded: bool = False):
        self.model, self.aux_layer_ids, self.sharded = model, list(aux_layer_ids), sharded
        self.device = next(model.parameters()).device
        self.forward_s = 0.0  # wall time in forwards (on CUDA: the time to queue them, not to run them)

    @torch.no_grad()
    def __call__(self, seqs: Sequence[Sequence[int] | np.ndarray]) -> list[torch.Tensor]:
        """Each sequence's [len, n_aux + 1, H], from one forward over them packed into one row (packed_batch:
        no padding, however their lengths differ)."""
        start = time.perf_counter()
        ids, position_ids, mask = packed_batch(seqs, self.model)
        with hidden_state_taps(self.model, self.aux_layer_ids) as taps:
            out = forward_hidden_states(self.model, ids, mask, taps, position_ids)[0]
        self.forward_s += time.perf_counter() - start
        return list(out.split([len(seq) for seq in seqs]))


def load_online_verifier(verifier_dir: Path, aux_layer_ids: Sequence[int], device: torch.device, world: World,
                         shard: bool) -> OnlineVerifier:
    """The verifier on this rank: a full copy, or (`shard` with more than one rank) an FSDP2 shard of each decoder
    layer and of the rest of the decoder; its lm_head is then dropped, since the hidden states never need it."""
    dtype = getattr(torch, compute_dtype_on(device.type))
    if not (shard and world.distributed):
        model = Verifier(verifier_dir).load(device, dtype)
        model.requires_grad_(False)
        return OnlineVerifier(model, aux_layer_ids)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    # Loaded into host memory, then sharded layer by layer: fully_shard moves each layer's parameters to the
    # rank's device as it shards them, so a device only ever holds one whole layer.
    model = Verifier(verifier_dir).load("cpu", dtype)
    model.requires_grad_(False)
    model.lm_head = None
    decoder = model.get_decoder()
    # One mesh of the job's ranks on this rank's device type (fully_shard's default would be CUDA's whenever a GPU
    # is visible, also for device=cpu). No backward ever runs: every group, the root too, reshards after forward.
    mesh = init_device_mesh(device.type, (world.size,))
    for layer in decoder.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    fully_shard(decoder, mesh=mesh, reshard_after_forward=True)
    # DTensor parameters: numel() is the whole tensor's, to_local() this rank's shard of it.
    total = sum(p.numel() for p in decoder.parameters())
    held = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in decoder.parameters())
    log.info("verifier sharded across %d ranks (data.shard_verifier=true): this rank holds %d of its %d "
             "decoder parameters", world.size, held, total)
    return OnlineVerifier(model, aux_layer_ids, sharded=True)


def check_online_verifier(verifier_dir: Path, draft: DraftConfig) -> int | None:
    """What online data needs of the verifier, checked before any rank starts from its config.json and file headers
    (no weights loaded): the draft's hidden and vocabulary sizes, attention that packing keeps per document, and
    whole weights to load. Returns its positions (max_position_embeddings; None when its config does not say),
    which bound a row's length."""
    from eagle3.verifier.forward import packing_problem

    verifier = Verifier(verifier_dir)
    # Aux layer ids within its depth: eagle3.verifier.shape.check_verifier_dir, from the same config.json.
    hidden, vocab = verifier.size("hidden_size"), verifier.size("vocab_size")
    where = f"the verifier {verifier_dir}"
    if hidden is not None and hidden != draft.hidden_size:
        raise ConfigError(f"model.draft.hidden_size={draft.hidden_size} but {where} has hidden size {hidden}; "
                          f"model=auto reads the draft's shape from its config.json")
    if vocab is not None and vocab != draft.vocab_size:
        raise ConfigError(f"model.draft.vocab_size={draft.vocab_size} but {where} has a vocabulary of {vocab}; "
                          f"model=auto reads the draft's shape from its config.json")
    problem = packing_problem(verifier.transformers_config())
    if problem:
        raise ConfigError(f"data=online: {where}: {problem}")
    verifier.check_weights()
    return verifier.positions


class HiddenStore:
    """Hidden states already computed, kept for the passes after, up to `budget` bytes: keyed by a val micro-batch's
    documents (a pass that packs them alike reads them back instead of running the verifier), or by a train row
    and its positions (data.cache_gb: a later epoch packs the row with other rows, and reads it back all the same).
    In memory, or with `directory` one file per key there, written through eagle3.safe_write under `base`, the dir
    emptied when the store is made and removed with `clear` or when the store is dropped (a run-local cache). What
    is over the budget is computed again at every pass."""

    def __init__(self, budget: int, directory: Path | None = None, base: Path | None = None):
        self.budget, self.directory = budget, directory
        self.base = base if base is not None else directory
        self.used = 0
        self.held: dict[tuple[int, ...], torch.Tensor | Path] = {}
        self.full = False
        if directory is not None:
            assert self.base is not None
            make_dirs(self.base, directory.parent)
            fresh_temp(self.base, directory)  # a killed run's files, never read: their index died with it
            weakref.finalize(self, remove_store_dir, directory)

    def get(self, key: tuple[int, ...]) -> torch.Tensor | None:
        held = self.held.get(key)
        if isinstance(held, Path):
            return torch.load(held, weights_only=True)
        return held

    def put(self, key: tuple[int, ...], hidden: torch.Tensor) -> None:
        size = hidden.numel() * hidden.element_size()
        if key in self.held or self.used + size > self.budget:
            if not self.full and key not in self.held:
                self.full = True
                log.info("online hidden states: the cache's budget (%.2f GB) is full; what is beyond it runs the "
                         "verifier at every pass", self.budget / 1e9)
            return
        if self.directory is None:
            self.held[key] = hidden.clone()
        else:
            assert self.base is not None
            file = self.directory / ("_".join(str(k) for k in key) + ".pt")
            kept = hidden.cpu().clone()  # a view would save its whole storage
            replace_file(self.base, file, lambda tmp: torch.save(kept, tmp))
            self.held[key] = file
        self.used += size

    def clear(self) -> None:
        if self.directory is not None:
            remove_store_dir(self.directory)
        self.held, self.used = {}, 0


def remove_store_dir(directory: Path) -> None:
    """A store's dir, and its parent once no other rank's store is left in it."""
    shutil.rmtree(directory, ignore_errors=True)
    try:
        directory.parent.rmdir()
    except OSError:
        pass


# The val split's hidden states are kept in memory for the run's later val passes, up to this many bytes (a val
# split larger than that runs the verifier again for the rest at every pass).
VAL_KEEP_BYTES = 2 * 10 ** 9


class OnlineLoader:
    """This rank's micro-batches of one split, in `batch_sampler`'s order, with hidden states from `verifier`:
    what PackedLoader gives for the same rows (see the module doc). The buffer is allocated once on the verifier's
    device and refilled at every micro-batch: a micro-batch is valid until the next one is requested. With a
    `store`, a micro-batch whose documents were computed at an earlier pass is read back from it instead of running
    the verifier (the same values: what the verifier gave then, rounded as then). With a `row_store` (the train
    split, data.cache_gb), each document's hidden states are kept by row, and a later epoch, which packs the rows
    otherwise, runs the verifier only over the rows it does not hold (what it holds: the values of the forward that
    first computed the row, which may differ from another packing's in fp32's last bits)."""

    def __init__(self, verifier: OnlineVerifier, rows: ArrowRows, split_rows: Sequence[int], batch_sampler,
                 total_seq_len: int, num_aux_layers: int, hidden_size: int, dtype: torch.dtype,
                 store: HiddenStore | None = None, row_store: HiddenStore | None = None):
        self.verifier, self.rows, self.split_rows = verifier, rows, split_rows
        self.batch_sampler, self.total_seq_len, self.dtype = batch_sampler, total_seq_len, dtype
        self.shape = (total_seq_len + 1, num_aux_layers + 1, hidden_size)
        self.buffer: torch.Tensor | None = None
        self.store, self.row_store = store, row_store

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for docs in list(self.batch_sampler):
            yield self.fill(docs)

    def fill(self, docs: Sequence[int]) -> dict[str, torch.Tensor]:
        if self.buffer is None:
            self.buffer = torch.empty(self.shape, dtype=self.dtype, device=self.verifier.device)
        buf, pack = self.buffer, Pack(self.rows, self.split_rows, docs, self.total_seq_len)
        pieces = [(row, q, r) for row, q, r in pack.pieces if r]
        key = tuple(int(d) for d in docs)
        kept = self.store.get(key) if self.store is not None and pieces else None
        if kept is not None:
            buf[:pack.end + 1] = kept
        elif pieces:
            hidden = self.hidden(pieces)
            for s, (_, q, r) in enumerate(pieces):
                buf[q:q + r] = hidden[s][:r]
            for s, (_, q, r) in enumerate(pieces):  # after the big parts, as the offline reader lays them out
                buf[q + r, -1] = hidden[s][r, -1]
            if self.store is not None:
                self.store.put(key, buf[:pack.end + 1])
        elif self.verifier.sharded:  # only 1-token rows: the sharded forward is a collective every rank must join
            self.verifier([[0]])
        return pack.batch(buf)

    def hidden(self, pieces: Sequence[tuple[int, int, int]]) -> list[torch.Tensor]:
        """Each piece's [r + 1, n_aux + 1, H]: from the row store where it holds the row, the others from one
        verifier forward (and kept, rounded to the buffer's dtype as the buffer rounds them, while the budget
        allows)."""
        if self.row_store is None:
            return self.verifier([self.rows.input_ids(row)[:r + 1] for row, _, r in pieces])
        got = [self.row_store.get((row, r)) for row, _, r in pieces]
        missing = [s for s, h in enumerate(got) if h is None]
        if missing:
            computed = self.verifier([self.rows.input_ids(pieces[s][0])[:pieces[s][2] + 1] for s in missing])
            for s, h in zip(missing, computed, strict=True):
                row, _, r = pieces[s]
                h = h[:r + 1].to(self.dtype)
                self.row_store.put((row, r), h)
                got[s] = h
        return [h.to(self.verifier.device) for h in got if h is not None]

    def check_row(self, row: int) -> None:
        """Nothing to check per row: check_online_verifier checked the shapes before any rank started."""
