"""Val metrics are a property of the weights and the val split: the same for any world size or grad_accum,
and never computed from non-finite hidden states (an error, or with on_bad_sample=skip, those rows left out
and counted)."""

from __future__ import annotations

import json
import math
import shutil
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from commands import launch
from factories import AUX, LENGTHS, RATIO, SMALL_DATA, VOCAB, H, T, draft_for_dataset, read_rows

pytestmark = pytest.mark.filterwarnings("ignore:Found .* samples longer than batch_max_length")

VAL_ROWS = list(range(int(len(LENGTHS) * RATIO), len(LENGTHS)))
NAN_ROW = VAL_ROWS[3]
PROMPT = 4  # leading tokens out of the loss, as a chat prompt is


def chat_masks() -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [[0] * min(n, PROMPT) + (torch.rand(max(n - PROMPT, 0), generator=gen) > 0.3).long().tolist()
            for n in LENGTHS]


MASKS = chat_masks()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """test_loader's documents, with a prompt: speculators pairs a document's first ttt_steps - 1 drafted
    positions with the end of the document packed before it, and a prompt keeps those out of the loss (as
    in chat data), so that the packing cannot show in the val metrics."""
    from datasets import Dataset

    out = tmp_path_factory.mktemp("val") / "data"
    gen = torch.Generator().manual_seed(2)
    ids = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in LENGTHS]
    (out / "hidden_states").mkdir(parents=True)
    for i, n in enumerate(LENGTHS):
        save_file({"hidden_states": torch.randn(n, AUX + 1, H, generator=gen), "token_ids": torch.tensor(ids[i])},
                  str(out / "hidden_states" / f"hs_{i}.safetensors"))
    Dataset.from_dict({"input_ids": ids, "loss_mask": MASKS, "seq_len": LENGTHS}).with_format("torch").save_to_disk(
        str(out))
    return out


@pytest.fixture(scope="module")
def nan_data_dir(data_dir, tmp_path_factory) -> Path:
    """The same dataset with NaN in some hidden states of one val row."""
    out = tmp_path_factory.mktemp("val") / "nan"
    shutil.copytree(data_dir, out)
    poison_hidden_states(out, NAN_ROW)
    return out


def poison_hidden_states(data_dir: Path, row: int) -> None:
    path = data_dir / "hidden_states" / f"hs_{row}.safetensors"
    tensors = load_file(str(path))
    tensors["hidden_states"][2, 0, :5] = float("nan")  # an aux slot of a position the model reads
    save_file(tensors, str(path))


def val_loader(data_dir: Path, **kwargs):
    from eagle3.data.loader import LoaderSpec, build_loaders

    return build_loaders(data_dir, LoaderSpec(T, H, AUX, RATIO, seed=0, **kwargs))[1]


def validate(loader, **kwargs) -> dict[str, float]:
    from speculators.losses import resolve_loss_config

    from eagle3.train.validation import run_validation

    call = {"ttt_steps": 3, "ttt_step_loss_decay": 1.0, "loss_config": resolve_loss_config("kl_div", "eager")}
    return run_validation(draft_for_dataset({}), loader, torch.device("cpu"), nullcontext(), call, **kwargs)


def assert_same_metrics(a: dict[str, float], b: dict[str, float]) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-7), k


@pytest.mark.parametrize("world_size,grad_accum", [(1, 1), (1, 2), (2, 1), (3, 2)])
def test_every_val_row_is_counted_once_for_any_sharding(data_dir, world_size, grad_accum):
    per_rank = []
    for rank in range(world_size):
        sampler = val_loader(data_dir, world_size=world_size, rank=rank, grad_accum=grad_accum).batch_sampler
        per_rank.append((len(sampler), list(sampler)[:getattr(sampler, "counted", len(sampler))]))
    assert len({n for n, _ in per_rank}) == 1  # every rank runs the same number of forwards
    counted = sorted(VAL_ROWS[0] + int(i) for _, packs in per_rank for pack in packs for i in pack)
    assert counted == VAL_ROWS


def test_val_metrics_do_not_depend_on_grad_accum(data_dir):
    one = validate(val_loader(data_dir))
    accum = validate(val_loader(data_dir, grad_accum=2))
    assert_same_metrics(one, accum)
    assert math.isfinite(one["loss"]) and one["tau_sim"] >= 1.0


def test_val_loss_is_token_weighted_over_the_split(data_dir):
    """Each step's loss is the mean over every loss-masked position of the split, whatever the packing:
    the val rows one by one give the same numbers, weighted by their positions."""
    whole = validate(val_loader(data_dir))
    per_row = [validate(val_loader(data_dir, rows=[*range(VAL_ROWS[0]), r])) for r in VAL_ROWS]
    for k in range(3):
        # Row r's loss-masked positions at step k (after the shift, its first k have no drafted token).
        positions = [int(torch.as_tensor(MASKS[r][1:][k:]).sum()) for r in VAL_ROWS]
        weighted = sum(m[f"loss_{k}"] * n for m, n in zip(per_row, positions)) / sum(positions)
        assert whole[f"loss_{k}"] == pytest.approx(weighted, rel=1e-5), k
    assert whole["loss"] == pytest.approx(sum(whole[f"loss_{k}"] for k in range(3)), rel=1e-9)


def test_non_finite_val_hidden_states_are_one_error_naming_the_row(nan_data_dir):
    from eagle3.train.validation import ValNotFinite

    with pytest.raises(ValNotFinite) as err:
        validate(val_loader(nan_data_dir), where="the val pass at step 7")
    message = str(err.value)
    assert "the val pass at step 7" in message and f"hs_{NAN_ROW}.safetensors" in message
    assert "data.on_bad_sample=skip" in message


def test_skip_leaves_the_non_finite_rows_out_of_val_and_counts_them(data_dir, nan_data_dir):
    skipped = validate(val_loader(nan_data_dir), on_bad_sample="skip")
    assert skipped.pop("skipped_rows") == 1
    without_row = [r for r in range(len(LENGTHS)) if r != NAN_ROW]
    clean = validate(val_loader(data_dir, rows=without_row), on_bad_sample="skip")
    assert clean.pop("skipped_rows") == 0
    assert_same_metrics(skipped, clean)


# End to end: the launcher, the tiny default's synthetic data, CPU ranks over gloo.

PROBE = ["optim.max_steps=0", "logger.mode=disabled", *SMALL_DATA]


def step0_val(run_dir: Path) -> dict:
    (row,) = [r for r in read_rows(run_dir) if r["split"] == "val" and r["step"] == 0]
    return {k: v for k, v in row.items() if k not in ("step", "split", "epoch")}


@pytest.fixture(scope="module")
def probe_one_process(cache_dir, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("probe") / "one"
    proc = launch([f"hydra.run.dir={run_dir}", *PROBE], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("sharding", [["optim.grad_accum=2"], ["distributed=ddp", "distributed.nproc_per_node=2"]],
                         ids=["grad_accum=2", "ddp-2-ranks"])
def test_step0_val_equals_one_process_for_grad_accum_and_ranks(probe_one_process, cache_dir, tmp_path, sharding):
    run_dir = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run_dir}", *PROBE, *sharding], cache_dir)  # two ranks: processes of their own
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours, one = step0_val(run_dir), step0_val(probe_one_process)
    assert ours.keys() == one.keys() and "tau_sim" in one
    for k in one:
        assert ours[k] == pytest.approx(one[k], rel=1e-5, abs=1e-7), k


@pytest.fixture(scope="module")
def tiny_nan_data(probe_one_process, tmp_path_factory) -> tuple[Path, int]:
    """A copy of the tiny default's synthetic dataset (SMALL_DATA) with NaN in one val row's hidden states."""
    from eagle3.formats.arrow_rows import ArrowRows

    source = Path(json.loads((probe_one_process / "summary.json").read_text())["data_dir"])
    out = tmp_path_factory.mktemp("nan") / "data"
    shutil.copytree(source, out)
    rows = len(ArrowRows(out))
    row = int(rows * 0.9) + 2  # a val row (data/tiny.yaml: train_ratio 0.9)
    poison_hidden_states(out, row)
    return out, row


@pytest.mark.slow
def test_a_nan_val_row_stops_the_run_with_one_message(tiny_nan_data, cache_dir, tmp_path):
    data, row = tiny_nan_data
    run_dir = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run_dir}", "data=offline", f"data.path={data}", "data.train_ratio=0.9",
                   *PROBE[:2], *SMALL_DATA[2:]], cache_dir)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "val pass at step 0" in proc.stderr and f"hs_{row}.safetensors" in proc.stderr, proc.stderr[-3000:]
    assert not (run_dir / "checkpoints" / "best").exists()  # nothing ranked by it


@pytest.mark.slow
def test_a_nan_val_row_is_skipped_and_counted_with_skip(tiny_nan_data, probe_one_process, cache_dir, tmp_path):
    data, _ = tiny_nan_data
    run_dir = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run_dir}", "data=offline", f"data.path={data}", "data.train_ratio=0.9",
                   "data.on_bad_sample=skip", *PROBE[:2], *SMALL_DATA[2:]], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    val, clean = step0_val(run_dir), step0_val(probe_one_process)
    assert val.pop("skipped_rows") == 1
    assert math.isfinite(val["loss"]) and val["loss"] == pytest.approx(clean["loss"], rel=0.05)
    assert val["tau_sim"] == pytest.approx(clean["tau_sim"], abs=0.05)


@pytest.mark.slow
def test_a_val_pass_gone_non_finite_mid_run_keeps_the_last_checkpoint(probe_one_process, cache_dir, tmp_path):
    """The val split turns bad after step 0 (NaN written into a val row's file): the val pass at step 3 stops
    the run, `best` keeps step 0, `last` keeps step 2."""
    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.init import InitContext, build_draft
    from eagle3.init.checkpoint import load_trainer_state
    from eagle3.train.loop import Training, ValEntries, train
    from eagle3.train.track import Tracker
    from eagle3.train.validation import ValNotFinite
    from factories import typed_run_config

    source = Path(json.loads((probe_one_process / "summary.json").read_text())["data_dir"])
    data = tmp_path / "data"
    shutil.copytree(source, data)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    cfg = typed_run_config(cache_dir, run_dir, ["optim.max_steps=4", "optim.checkpoint_every=2", "optim.eval_every=3"])
    verifier_dir = Path(json.loads((probe_one_process / "summary.json").read_text())["verifier_dir"])
    draft = cfg.model.draft
    train_loader, val = build_loaders(data, LoaderSpec(cfg.data.total_seq_len, draft.hidden_size,
                                                       len(draft.aux_layer_ids), cfg.data.train_ratio, cfg.seed))
    model, _ = build_draft(InitContext(draft, cfg.init, verifier_dir, data, "sdpa", []))
    val_row = int(val.split_rows[0])

    def corrupt_after_step0(_model):
        poison_hidden_states(data, val_row)
        return {}

    with pytest.raises(ValNotFinite, match="val pass at step 3"), Tracker(run_dir, cfg.logger) as tracker:
        train(Training(model, (train_loader, val), cfg, tracker, hooks=[ValEntries(corrupt_after_step0)]))
    assert load_trainer_state(run_dir / "checkpoints" / "last")["progress"]["step"] == 2
    rows = [r for r in read_rows(run_dir) if r["split"] == "val"]
    assert [r["step"] for r in rows] == [0] and all(math.isfinite(r["loss"]) for r in rows)
