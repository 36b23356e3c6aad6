"""The reader (eagle3.data.reader) gives exactly speculators' micro-batches (ArrowDataset + CollateFn with
shift_batch), and the same loss, from its one-copy buffers; bad files stop it with their names."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle3.data.loader import LoaderSpec, build_loaders
from eagle3.data.reader import split_hidden, to_device
from eagle3.formats.hidden_states import DataError
from factories import AUX, LENGTHS, RATIO, VOCAB, H, Speculators, T, draft_for_dataset, passes, write_dataset

# The sampler warns about the two long documents on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Found .* samples longer than batch_max_length")


@pytest.fixture(scope="module")
def data_bf16(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "bf16", torch.bfloat16)


@pytest.fixture(scope="module")
def data_fp32(tmp_path_factory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("data") / "fp32", torch.float32, seed=1)


def assert_same(ours: dict, ref: dict) -> None:
    assert sorted(ours) == sorted(ref)
    for k, v in ref.items():
        assert ours[k].dtype == v.dtype and ours[k].shape == v.shape, k
        assert torch.equal(ours[k], v), k


@pytest.mark.parametrize("sharding", [dict(), dict(world_size=2, rank=1, grad_accum=2)], ids=["1-rank", "rank1-of-2x2"])
def test_micro_batches_equal_speculators_field_by_field(data_bf16, sharding):
    loaders = build_loaders(data_bf16, LoaderSpec(T, H, AUX, RATIO, seed=3, **sharding))
    in_files_dtype, trainer_dtype = Speculators(data_bf16, torch.bfloat16), Speculators(data_bf16, torch.float32)
    seen = {"several documents": 0, "padding": 0, "cut at T": 0}
    for loader in loaders:
        for rows, batch in passes(loader):
            small = {k: v for k, v in batch.items() if k != "hidden_buffer"}
            # The views in the files' dtype, and what the CPU trainer feeds the model (float32).
            assert_same({**small, **split_hidden(batch["hidden_buffer"])}, in_files_dtype.batch(rows))
            assert_same(to_device(batch, torch.device("cpu")), trainer_dtype.batch(rows))
            seen["several documents"] += len(rows) > 1
            seen["padding"] += bool((batch["document_ids"] < 0).any())
            seen["cut at T"] += any(LENGTHS[r] - 1 > T for r in rows)
    assert all(seen.values()), seen


@pytest.mark.slow  # every micro-batch of an epoch through the model, three ways: 6-11 s on 2 cores
@pytest.mark.parametrize("flags", [{}, {"fc_norm": True, "norm_before_fc": False}], ids=["speculators", "fc_norm"])
def test_the_model_gives_the_same_loss_and_metrics(data_bf16, data_fp32, flags):
    from speculators.losses import resolve_loss_config

    model = draft_for_dataset(flags)
    kwargs = {"ttt_steps": 3, "loss_config": resolve_loss_config("kl_div", "eager")}

    def run(m, inputs):
        with torch.no_grad():
            _, loss, metrics = m(**inputs, **kwargs)
        return loss, metrics

    def assert_equal(ours, ref):
        assert torch.equal(ours[0], ref[0])
        assert ours[1].keys() == ref[1].keys()
        for k in ref[1]:
            assert torch.equal(ours[1][k], ref[1][k]), k

    # bf16 files: the CPU trainer's float32 inputs; fp32 files: the views themselves (strided) reach the model.
    for data_dir in (data_bf16, data_fp32):
        train, _ = build_loaders(data_dir, LoaderSpec(T, H, AUX, RATIO, seed=0))
        ref = Speculators(data_dir, torch.float32)
        for rows, batch in passes(train, epochs=[0]):
            inputs = to_device(batch, torch.device("cpu"))
            if data_dir == data_fp32:
                assert not inputs["hidden_states"].is_contiguous()
            assert_equal(run(model, inputs), run(model, ref.batch(rows)))
    # As on CUDA: bf16 views (strided) into a bf16 model, against speculators' contiguous bf16 batch.
    bf16_model, ref = model.to(torch.bfloat16), Speculators(data_bf16, torch.bfloat16)
    train, _ = build_loaders(data_bf16, LoaderSpec(T, H, AUX, RATIO, seed=0))
    for rows, batch in passes(train, epochs=[0]):
        views = split_hidden(batch["hidden_buffer"])
        assert not views["hidden_states"].is_contiguous()
        small = {k: v for k, v in batch.items() if k != "hidden_buffer"}
        assert_equal(run(bf16_model, {**small, **views}), run(bf16_model, ref.batch(rows)))


def test_rows_leave_out_exactly_those_rows_and_keep_the_split(data_bf16):
    split_idx = int(len(LENGTHS) * RATIO)
    dropped = {0, 4, split_idx - 1, split_idx, len(LENGTHS) - 1}
    kept = [r for r in range(len(LENGTHS)) if r not in dropped]
    train, val = build_loaders(data_bf16, LoaderSpec(T, H, AUX, RATIO, seed=0, rows=kept))
    ref = Speculators(data_bf16, torch.bfloat16)
    for loader, expected in ((train, [r for r in kept if r < split_idx]), (val, [r for r in kept if r >= split_idx])):
        read = []
        for rows, batch in passes(loader, epochs=[0]):
            read += rows
            assert_same({**{k: v for k, v in batch.items() if k != "hidden_buffer"},
                         **split_hidden(batch["hidden_buffer"])}, ref.batch(rows))
        assert sorted(read) == expected
    with pytest.raises(ValueError, match="rows"):
        build_loaders(data_bf16, LoaderSpec(T, H, AUX, RATIO, seed=0, rows=[len(LENGTHS)]))


@pytest.fixture
def broken(data_bf16, tmp_path) -> Path:
    copy = tmp_path / "data"
    shutil.copytree(data_bf16, copy)
    return copy


def read_all(data_dir: Path, **kwargs) -> None:
    for loader in build_loaders(data_dir, LoaderSpec(T, H, AUX, RATIO, seed=0, **kwargs)):
        for _ in loader:
            pass


def test_changed_token_ids_stop_the_reader_naming_the_file_and_row(broken):
    path = broken / "hidden_states" / "hs_5.safetensors"
    tensors = load_file(str(path))
    tensors["token_ids"][3] = (tensors["token_ids"][3] + 1) % VOCAB
    save_file(tensors, str(path))
    with pytest.raises(DataError, match=r"hs_5\.safetensors: token_ids differ from the row's input_ids .* \(row 5;"):
        read_all(broken)


def test_a_missing_file_stops_the_reader_with_its_path(broken):
    path = broken / "hidden_states" / "hs_7.safetensors"
    path.unlink()
    with pytest.raises(DataError, match=f"{path}: missing"):
        read_all(broken)


def test_wrong_shapes_dtypes_and_truncated_files_are_refused(broken):
    shape_error = r"hs_0\.safetensors: hidden_states is BF16 \[1, 4, 32\], expected BF16 \[1, 4, 16\]"
    with pytest.raises(DataError, match=shape_error):
        build_loaders(broken, LoaderSpec(T, 16, AUX, RATIO, seed=0))  # the first file is checked at once
    path = broken / "hidden_states" / "hs_3.safetensors"
    tensors = load_file(str(path))
    save_file({**tensors, "hidden_states": tensors["hidden_states"].float()}, str(path))
    with pytest.raises(DataError, match=r"hs_3\.safetensors: hidden_states is F32 \[9, 4, 32\], expected BF16"):
        read_all(broken)
    save_file(tensors, str(path))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"hs_3\.safetensors: truncated"):
        read_all(broken)


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_held_batch_is_never_refilled_while_the_reader_runs_ahead(data_bf16, prefetch):
    train, _ = build_loaders(data_bf16, LoaderSpec(T, H, AUX, RATIO, seed=0, prefetch=prefetch))
    assert len(train.ring) == 0
    ref = Speculators(data_bf16, torch.bfloat16)
    count = 0
    for rows, batch in passes(train):
        time.sleep(0.02)  # the reader fills every other buffer meanwhile
        assert_same({**{k: v for k, v in batch.items() if k != "hidden_buffer"},
                     **split_hidden(batch["hidden_buffer"])}, ref.batch(rows))
        count += 1
    assert len(train.ring) == prefetch + 1 and count > len(train.ring)


def test_a_new_pass_ends_the_previous_one(data_bf16):
    train, _ = build_loaders(data_bf16, LoaderSpec(T, H, AUX, RATIO, seed=0))
    first = iter(train)
    next(first)
    ref = Speculators(data_bf16, torch.bfloat16)
    for rows, batch in passes(train, epochs=[1]):
        assert not first.thread.is_alive()
        assert torch.equal(split_hidden(batch["hidden_buffer"])["hidden_states"], ref.batch(rows)["hidden_states"])
    abandoned = iter(train)
    next(abandoned)
    thread = abandoned.thread
    del abandoned  # dropping a pass stops its reader thread
    assert not thread.is_alive()


def test_every_epoch_trains_every_train_row_once_in_the_steps_the_schedule_counted():
    """For any seed, row lengths, ranks and grad_accum: the loop's cadence, built from the sampler's steps, takes
    grad_accum micro-batches per step from every rank's sampler, epoch after epoch (a resumed epoch skipping the
    steps done), never running out, and each epoch's micro-batches of all ranks hold every train row once."""
    from eagle3.data.loader import ShardedBatchSampler
    from eagle3.formats.packing import steps_per_epoch
    from eagle3.train.cadence import Cadence

    rng = np.random.default_rng(0)
    for case in range(60):
        t = int(rng.choice([16, 64, 128]))
        lengths = rng.integers(1, 2 * t, int(rng.integers(1, 50))).tolist()
        world, accum, seed = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(0, 1000))
        samplers = [ShardedBatchSampler(lengths, t, world, rank, accum, seed) for rank in range(world)]
        cadence = Cadence.of(3, None, samplers[0].steps, 1, None, None, 10)
        assert cadence.total_steps == 3 * samplers[0].steps
        for epoch in range(3):
            skip = int(rng.integers(0, samplers[0].steps + 1))
            trained: list[int] = []
            for sampler in samplers:
                sampler.set_epoch(epoch)
                whole = iter(sampler)
                steps = [[next(whole) for _ in range(accum)] for _ in range(cadence.steps_per_epoch)]
                assert next(whole, None) is None, case  # nothing left that no step trains
                trained += [row for step in steps for micro_batch in step for row in micro_batch]
                sampler.set_epoch(epoch, skip_steps=skip)  # resumed after `skip` steps of this epoch
                assert len(sampler) == (cadence.steps_per_epoch - skip) * accum
                assert list(sampler) == [mb for step in steps[skip:] for mb in step], case
            assert sorted(trained) == list(range(len(lengths))), case
        # The count every rank, the plan and the launch's checks ask (eagle3/formats/packing.py).
        assert {s.steps for s in samplers} == {steps_per_epoch(lengths, t, world * accum)}, case
