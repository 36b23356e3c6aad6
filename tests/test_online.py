"""data=online against offline data (issue 17's "done when"): the same rows give the same micro-batches from the
online loader as from prepared files, the same losses end to end for one process and 2 DDP ranks, the tiny
default's metrics without a hidden-state file written, and a run stopped mid-epoch resumes to the same metrics."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, SMALL_DATA, launch, read_rows

# The sampler warns about the rows longer than a micro-batch on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Found .* samples longer than batch_max_length")

VOCAB, HIDDEN, LAYERS = 256, 64, 7
AUX = [2, 3, 4]  # model=auto's default for 7 layers: [2, N//2, N-3]
T = 64           # tokens per micro-batch
RATIO = 0.8


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    """A small Llama verifier saved as a Hugging Face model dir (config.json + safetensors): model=auto reads it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=128, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=False)
    path = tmp_path_factory.mktemp("online") / "verifier"
    LlamaForCausalLM(config).save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def rows() -> list[tuple[list[int], list[int]]]:
    """48 rows: rows of 1 and 2 tokens (nothing or one position left after the shift), many that pack several to
    a micro-batch, and three longer than one (cut at T; fewer than the 10% share the start-up check refuses)."""
    rng = random.Random(0)
    lengths = [1, 2, 1, 2, 90, 130, 200] + [rng.randint(3, 60) for _ in range(41)]
    rng.shuffle(lengths)
    out = []
    for n in lengths:
        ids = [rng.randrange(VOCAB) for _ in range(n)]
        prompt = rng.randint(0, min(8, n - 1))
        mask = [0] * prompt + [int(rng.random() > 0.2) for _ in range(n - prompt)]
        mask[-1] = 1  # a row with an empty loss mask is a bad row
        out.append((ids, mask))
    return out


# --- loader level: the online loader's micro-batches are the offline reader's ------------------------------

@pytest.fixture(scope="module")
def datasets(verifier, rows, tmp_path_factory) -> dict[str, Path]:
    """The rows prepared offline in fp32 and in bf16 (eagle3.data.prepare's writer), and as token rows alone."""
    from eagle3.data.prepare import write_dataset
    from eagle3.data.token_rows import save_rows
    from eagle3.data.verifier_forward import load_causal_lm

    tmp = tmp_path_factory.mktemp("online-data")
    model = load_causal_lm(verifier)
    for name, dtype in [("float32", torch.float32), ("bfloat16", torch.bfloat16)]:
        write_dataset(model, verifier, rows, tmp / name, AUX, batch_tokens=512, dtype=dtype)
    save_rows(rows, tmp / "rows")
    assert not (tmp / "rows" / "hidden_states").exists()
    return {"float32": tmp / "float32", "bfloat16": tmp / "bfloat16", "rows": tmp / "rows"}


@pytest.fixture(scope="module")
def online_verifier(verifier):
    from eagle3.data.online import OnlineVerifier
    from eagle3.data.verifier_forward import load_causal_lm

    return OnlineVerifier(load_causal_lm(verifier), AUX)


def loaders(data_dir: Path, world_size: int, rank: int, grad_accum: int, **online):
    from eagle3.data.loader import build_loaders

    return build_loaders(data_dir, T, HIDDEN, len(AUX), RATIO, seed=3, world_size=world_size, rank=rank,
                         grad_accum=grad_accum, **online)


def micro_batches(loader, epochs=(0, 1)):
    for epoch in epochs:
        loader.batch_sampler.set_epoch(epoch)
        yield from loader


SMALL = ("input_ids", "loss_mask", "position_ids", "document_ids")


@pytest.mark.parametrize("world_size, rank, grad_accum", [(1, 0, 1), (1, 0, 2), (2, 0, 2), (2, 1, 2)])
def test_online_micro_batches_are_the_offline_ones_in_fp32(datasets, online_verifier, world_size, rank, grad_accum):
    offline = loaders(datasets["float32"], world_size, rank, grad_accum)
    online = loaders(datasets["rows"], world_size, rank, grad_accum, verifier=online_verifier,
                     hidden_states_dtype=torch.float32)
    cut, short = 0, 0
    for split, off, on in [("train", offline[0], online[0]), ("val", offline[1], online[1])]:
        count = 0
        assert len(on) == len(off) > 0
        for a, b in zip(micro_batches(off), micro_batches(on), strict=True):
            assert sorted(a) == sorted(b) == sorted(["hidden_buffer", *SMALL])
            for key in SMALL:
                assert torch.equal(a[key], b[key]), f"{split} micro-batch {count}: {key}"
            assert a["hidden_buffer"].dtype == b["hidden_buffer"].dtype == torch.float32
            torch.testing.assert_close(b["hidden_buffer"], a["hidden_buffer"], rtol=0, atol=1e-5,
                                       msg=lambda m: f"{split} micro-batch {count}: {m}")
            positions = a["position_ids"][0]
            cut += int(positions[-1] == T)  # a document cut at the end of the micro-batch
            short += int((a["document_ids"][0] >= 0).sum() < T)
            count += 1
        assert count >= 2  # zip(strict=True): as many micro-batches online as offline
    assert cut and short  # packs that cut a document, and packs with room left
    assert online_verifier.forward_s > 0


def test_online_bf16_rounds_the_hidden_states_as_bf16_files_store_them(datasets, online_verifier):
    """hidden_states_dtype=bfloat16: the verifier's fp32 values rounded to bf16 as prepare rounds them into its
    files. Offline and online forwards differ in batch shape (prepare's batches of whole rows, online's one batch
    per micro-batch, rows cut to what the pack uses), so their fp32 values may differ in the last bits, and a
    value that lies on a bf16 rounding boundary can round to neighbouring bf16 values: at most one bf16 step
    apart, and rarely."""
    offline = loaders(datasets["bfloat16"], 1, 0, 1)
    online = loaders(datasets["rows"], 1, 0, 1, verifier=online_verifier, hidden_states_dtype=torch.bfloat16)
    total, differing = 0, 0
    for off, on in [(offline[0], online[0]), (offline[1], online[1])]:
        for a, b in zip(micro_batches(off), micro_batches(on), strict=True):
            for key in SMALL:
                assert torch.equal(a[key], b[key])
            x, y = a["hidden_buffer"], b["hidden_buffer"]
            assert x.dtype == y.dtype == torch.bfloat16
            step = 2.0 ** (torch.frexp(x.float().abs().clamp_min(1e-30))[1] - 8)  # one bf16 step at x's exponent
            assert ((x.float() - y.float()).abs() <= step * 1.01).all()
            total += x.numel()
            differing += int((x != y).sum())
    assert differing <= total * 1e-3, f"{differing} of {total} values differ"
