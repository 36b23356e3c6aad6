"""A val pass that meets non-finite hidden states names where they came from: files (hs_<i>.safetensors) offline,
the verifier's forward (val row numbers) online, as the loader that produced them says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_val_metrics import NAN_ROW, data_dir, nan_data_dir, validate  # noqa: F401  (the fixtures)

from eagle3.data.loader import LoaderSpec, build_loaders
from eagle3.data.online import OnlineVerifier
from eagle3.train.validation import ValNotFinite
from factories import AUX, RATIO, H, T

pytestmark = pytest.mark.filterwarnings("ignore:Found .* samples longer than batch_max_length")


class FileVerifier(OnlineVerifier):
    """A verifier whose hidden states are a data dir's files (of the row whose tokens the sequence starts)."""

    def __init__(self, data: Path):
        self.device, self.sharded = torch.device("cpu"), False
        self.files = [load_file(str(f)) for f in sorted((data / "hidden_states").glob("hs_*.safetensors"))]

    def __call__(self, seqs):
        out = []
        for seq in seqs:
            ids = [int(t) for t in seq]
            out.append(next(f["hidden_states"][:len(ids)] for f in self.files
                            if f["token_ids"][:len(ids)].tolist() == ids))
        return out


def test_nonfinite_hidden_states_from_the_verifier_are_named_as_its(nan_data_dir):  # noqa: F811
    val = build_loaders(nan_data_dir, LoaderSpec(T, H, AUX, RATIO, seed=0, hidden_states_dtype=torch.float32),
                        FileVerifier(nan_data_dir))[1]
    with pytest.raises(ValNotFinite) as e:
        validate(val)
    assert "get non-finite hidden states from the verifier" in str(e.value)
    assert f"row {NAN_ROW}" in str(e.value) and "safetensors" not in str(e.value)


def test_nonfinite_hidden_states_from_files_are_named_as_theirs(nan_data_dir):  # noqa: F811
    val = build_loaders(nan_data_dir, LoaderSpec(T, H, AUX, RATIO, seed=0))[1]
    with pytest.raises(ValNotFinite) as e:
        validate(val)
    assert "hold non-finite hidden states" in str(e.value) and f"hs_{NAN_ROW}.safetensors" in str(e.value)
