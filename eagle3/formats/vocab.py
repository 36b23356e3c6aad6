"""The draft vocabulary of a dataset: d2t/t2d built from its token frequencies, cached next to it under
speculators' names (`d2t-<V>.npy`, `t2d-<V>.npy`, V = draft vocabulary size) so every run and rank reuses them."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from eagle3.errors import DataError
from eagle3.safe_write import LinkRefused, open_write, replace_file

log = logging.getLogger(__name__)


TOKEN_FREQ = "token_freq.pt"


def read_token_freq(data_dir: Path, vocab_size: int | None = None) -> dict[int, int]:
    """The one reader of a dataset's token_freq.pt: {token id: count} over its loss tokens, as speculators'
    save_token_frequency_distribution writes it (torch.save of a dict of ints). Only tensors and plain data are
    ever loaded (weights_only): any other file is one DataError that says what the file should be, never torch's
    own advice to unpickle it. With `vocab_size`, ids outside that vocabulary are left out (with a warning)."""
    file = Path(data_dir) / TOKEN_FREQ
    expected = ("a token-count file: torch.save of a {token id: count} dict of non-negative ints, as "
                "eagle3 prepare and speculators' save_token_frequency_distribution write it")
    if not file.is_file():
        raise DataError(f"{data_dir} has no {TOKEN_FREQ} (the loss tokens' counts the draft vocabulary is built "
                        "from); eagle3 prepare writes it, as speculators' pipeline does")
    try:
        freq = torch.load(file, map_location="cpu", weights_only=True)
    except Exception:  # noqa: BLE001  (torch raises unpickling, zip, EOF and runtime errors alike)
        # torch's own message advises weights_only=False, i.e. running whatever the file holds: never passed on.
        raise DataError(f"{file} is not {expected}; it cannot be loaded as one (it is not a file torch.save writes, "
                        f"or it holds Python objects beyond tensors and plain data, which are never unpickled). "
                        f"Prepare the dataset again") from None
    if not isinstance(freq, dict):
        raise DataError(f"{file} is not {expected}; it holds a {type(freq).__name__}. Prepare the dataset again")
    for token, count in freq.items():
        if not (type(token) is int and token >= 0 and type(count) is int and count >= 0):
            raise DataError(f"{file} is not {expected}; it maps {token!r} to {count!r}. Prepare the dataset again")
    kept = {t: c for t, c in freq.items() if vocab_size is None or t < vocab_size}
    if len(kept) < len(freq):  # their rows are bad ones (the data check refuses or skips them): no draft slot
        log.warning("%s counts %d token ids outside the verifier's vocabulary of %d: left out of the draft vocabulary",
                    file, len(freq) - len(kept), vocab_size)
    return kept


def write_token_freq(rows: Iterable[tuple[Sequence[int], Sequence[int]]], file: Path) -> None:
    """`file` (a new name: never written through a link or over a file) as speculators'
    save_token_frequency_distribution writes token_freq.pt ({token id: count} over the rows' loss tokens, torch.save
    of a dict of ints; tests/data/test_data.py holds the two equal), from (input ids, loss mask) rows of ints.
    Counted here: importing speculators for its counter costs a process 8 seconds. A row whose mask is not one value
    per id is a DataError, before anything is written."""
    counts: Counter[int] = Counter()
    for number, (ids, mask) in enumerate(rows, start=1):
        if len(ids) != len(mask):
            raise DataError(f"{file.parent}: row {number} has {len(ids)} input ids and {len(mask)} loss mask values; "
                            "a row needs one mask value per id")
        counts.update(int(token) for token, kept in zip(ids, mask) if kept)
    with open_write(file.parent, file, "x", binary=True) as f:
        torch.save(dict(counts), f)


def vocab_mapping(data_dir: Path, draft_vocab_size: int, target_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t, t2d): the draft vocabulary is the most frequent loss tokens of the data (speculators' rule)."""
    data_dir = Path(data_dir)
    d2t_file, t2d_file = data_dir / f"d2t-{draft_vocab_size}.npy", data_dir / f"t2d-{draft_vocab_size}.npy"
    if d2t_file.is_file() and t2d_file.is_file():
        try:  # allow_pickle stays False: a cache file is only ever plain arrays
            d2t, t2d = torch.from_numpy(np.load(d2t_file)), torch.from_numpy(np.load(t2d_file))
        except (OSError, ValueError) as e:
            raise DataError(f"{d2t_file.name}/{t2d_file.name} in {data_dir} cannot be read as the cached draft "
                            f"vocabulary ({e}); remove them to rebuild") from None
        if d2t.shape != (draft_vocab_size,) or t2d.shape != (target_vocab_size,):
            raise DataError(f"{d2t_file.name}/{t2d_file.name} in {data_dir} map {d2t.shape[0]} draft tokens onto a "
                              f"vocabulary of {t2d.shape[0]}, but the run has {draft_vocab_size} and "
                              f"{target_vocab_size}: they belong to another verifier; remove them to rebuild")
        return d2t, t2d
    from speculators.train.vocab_mapping import build_vocab_mappings_from_distribution

    freq = read_token_freq(data_dir, target_vocab_size)
    d2t, t2d = build_vocab_mappings_from_distribution(freq, draft_vocab_size, target_vocab_size)
    try:
        for file, tensor in ((d2t_file, d2t), (t2d_file, t2d)):  # renamed into place: ranks never read half
            replace_file(data_dir, file, partial(_save_npy, data_dir, tensor.cpu().numpy()))
        log.info("cached the draft vocabulary in %s and %s", d2t_file, t2d_file)
    except (OSError, LinkRefused) as e:  # a read-only dataset, or a link in the way: build it again next time
        log.warning("could not cache the draft vocabulary in %s (%s)", data_dir, e)
    return d2t, t2d


def _save_npy(data_dir: Path, array: np.ndarray, tmp: Path) -> None:
    with open_write(data_dir, tmp, "x", binary=True) as f:
        np.save(f, array)
