"""The draft vocabulary of a dataset: d2t/t2d built from its token frequencies, cached next to it under
speculators' names (`d2t-<V>.npy`, `t2d-<V>.npy`, V = draft vocabulary size) so every run and rank reuses them."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import numpy as np
import torch

from eagle3.errors import DataError
from eagle3.safe_write import LinkRefused, open_write, replace_file

log = logging.getLogger(__name__)


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

    freq_file = data_dir / "token_freq.pt"
    if not freq_file.is_file():
        raise DataError(f"{data_dir} has no token_freq.pt (the loss tokens' counts the draft vocabulary is built "
                        "from); python -m eagle3.data.prepare writes it, as speculators' pipeline does")
    try:
        freq = torch.load(freq_file, weights_only=True)
    except Exception as e:  # torch raises pickle, zip and runtime errors alike for a file that is not its format
        raise DataError(f"{freq_file} cannot be read as token counts ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); prepare the dataset again") from None
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
