"""data=online against offline data (issue 17's "done when"): the same rows give the same micro-batches from the
online loader as from prepared files, the same losses end to end for one process and 2 DDP ranks, the tiny
default's metrics without a hidden-state file written, and a run stopped mid-epoch resumes to the same metrics."""

from __future__ import annotations

import json
import random
import signal
from pathlib import Path

import pytest
import torch

from commands import launch, sigterm_in_process_after_step_1
from factories import SMALL_DATA, read_rows, verifier_dir

# The sampler warns about the rows longer than a micro-batch on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Found .* samples longer than batch_max_length")

VOCAB, HIDDEN, LAYERS = 256, 64, 7
AUX = [2, 3, 4]  # model=auto's default for 7 layers: [2, N//2, N-3]
T = 64           # tokens per micro-batch
RATIO = 0.8


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    """A small Llama verifier saved as a Hugging Face model dir (config.json + safetensors): model=auto reads it."""
    return verifier_dir(tmp_path_factory.mktemp("online") / "verifier", vocab_size=VOCAB, hidden_size=HIDDEN,
                        intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                        max_position_embeddings=512, tie_word_embeddings=False)


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
    from eagle3.verifier.model import Verifier

    tmp = tmp_path_factory.mktemp("online-data")
    model = Verifier(verifier).load()
    for name, dtype in [("float32", torch.float32), ("bfloat16", torch.bfloat16)]:
        write_dataset(model, verifier, rows, tmp / name, AUX, batch_tokens=512, dtype=dtype)
    save_rows(rows, tmp / "rows")
    assert not (tmp / "rows" / "hidden_states").exists()
    return {"float32": tmp / "float32", "bfloat16": tmp / "bfloat16", "rows": tmp / "rows"}


@pytest.fixture(scope="module")
def online_verifier(verifier):
    from eagle3.data.online import OnlineVerifier
    from eagle3.verifier.model import Verifier

    return OnlineVerifier(Verifier(verifier).load(), AUX)


def loaders(data_dir: Path, world_size: int, rank: int, grad_accum: int, verifier=None, train_store=None, **online):
    from eagle3.data.loader import LoaderSpec, build_loaders

    return build_loaders(data_dir, LoaderSpec(T, HIDDEN, len(AUX), RATIO, seed=3, world_size=world_size, rank=rank,
                                              grad_accum=grad_accum, **online), verifier, train_store=train_store)


def micro_batches(loader):
    """Two epochs, then the second again resumed after its first step (as a resumed run starts mid-epoch)."""
    for epoch, skip_steps in [(0, 0), (1, 0), (1, 1)]:
        loader.batch_sampler.set_epoch(epoch, skip_steps)
        yield from loader


SMALL = ("input_ids", "loss_mask", "position_ids", "document_ids")


@pytest.mark.slow  # the verifier's forward for every micro-batch of an epoch: 8-16 s each on 2 cores
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
            where = f"{split} micro-batch {count}"
            torch.testing.assert_close(b["hidden_buffer"], a["hidden_buffer"], rtol=0, atol=1e-5,
                                       msg=lambda m, where=where: f"{where}: {m}")
            positions = a["position_ids"][0]
            cut += int(positions[-1] == T)  # one row filling the whole micro-batch: a longer row, cut
            short += int((a["document_ids"][0] >= 0).sum() < T)
            count += 1
        assert count >= 2  # zip(strict=True): as many micro-batches online as offline
    assert cut and short  # packs that cut a document, and packs with room left
    assert online_verifier.forward_s > 0


def test_a_val_pass_after_the_first_reads_its_hidden_states_back_without_the_verifier(verifier, rows, tmp_path):
    """The val split's hidden states are computed once per run: the second val pass calls the verifier 0 times and
    gives the micro-batches (so the metrics) of a loader that computes every pass, bit for bit."""
    from eagle3.data.online import OnlineVerifier
    from eagle3.data.token_rows import save_rows
    from eagle3.verifier.model import Verifier

    class Counted(OnlineVerifier):
        calls = 0

        def __call__(self, seqs):
            Counted.calls += 1
            return super().__call__(seqs)

    save_rows(rows, tmp_path / "rows")
    counted = Counted(Verifier(verifier).load(), AUX)
    _, val = loaders(tmp_path / "rows", 1, 0, 1, verifier=counted, hidden_states_dtype=torch.float32)
    _, uncached = loaders(tmp_path / "rows", 1, 0, 1, verifier=OnlineVerifier(counted.model, AUX),
                          hidden_states_dtype=torch.float32)
    assert val.store is not None and uncached.store is not None
    uncached.store = None  # computes every pass
    first = [{k: v.clone() for k, v in b.items()} for b in val]
    calls_first, Counted.calls = Counted.calls, 0
    second = [{k: v.clone() for k, v in b.items()} for b in val]
    assert calls_first == len(first) >= 2 and Counted.calls == 0
    for a, b, c in zip(first, second, uncached, strict=True):
        assert all(torch.equal(a[k], b[k]) and torch.equal(b[k], c[k]) for k in a)


@pytest.mark.slow  # six epochs of the small verifier's forwards: ~5 s idle, 15 s on 2 loaded cores
def test_an_online_second_epoch_reads_the_train_rows_kept_within_data_cache_gb(verifier, rows, tmp_path):
    """data.cache_gb: the first epoch's train rows are kept on disk up to the budget; with room for all of them the
    second epoch (packed otherwise) runs the verifier over no row, with room for some over the others only, and its
    micro-batches are those of a loader that computes every epoch (the first epoch's bit for bit; the second up to
    fp32's last bits, which depend on the rows a forward packs together)."""
    from eagle3.data.online import HiddenStore, OnlineVerifier
    from eagle3.data.token_rows import save_rows
    from eagle3.verifier.model import Verifier

    class Counted(OnlineVerifier):
        rows = 0

        def __call__(self, seqs):
            self.rows += len(seqs)
            return super().__call__(seqs)

    save_rows(rows, tmp_path / "rows")
    model = Verifier(verifier).load()

    def epochs(budget: int | None, name: str):
        counted = Counted(model, AUX)
        store = None if budget is None else HiddenStore(budget, tmp_path / "run" / name, base=tmp_path / "run")
        train, _ = loaders(tmp_path / "rows", 1, 0, 1, verifier=counted, hidden_states_dtype=torch.float32,
                           train_store=store)
        out = []
        for epoch in (0, 1):
            train.batch_sampler.set_epoch(epoch)
            before = counted.rows
            out.append(([{k: v.clone() for k, v in b.items()} for b in train], counted.rows - before))
        return out, store

    (first, rows_first), (second, rows_second) = epochs(None, "")[0]
    pieces = rows_first  # one verifier row per document with a position to train on
    assert rows_second == pieces > 10
    for budget, name in [(10 ** 9, "all"), (20_000, "some")]:
        (cached_first, computed_first), (cached_second, computed_second) = (got := epochs(budget, name))[0]
        store = got[1]
        assert computed_first == pieces
        files = list((tmp_path / "run" / name).iterdir())
        assert len(files) == len(store.held) and store.used <= budget
        if name == "all":
            assert computed_second == 0 and len(files) == pieces
        else:
            assert 0 < len(files) < pieces and computed_second == pieces - len(files)
        for a, b in zip(first, cached_first, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in a)
        assert not all(torch.equal(a[k], b[k]) for a, b in zip(first, second) for k in a)  # repacked
        for a, b in zip(second, cached_second, strict=True):
            assert all(torch.equal(a[k], b[k]) for k in SMALL)
            torch.testing.assert_close(b["hidden_buffer"], a["hidden_buffer"], rtol=0, atol=1e-6)
        del got, store  # the store's dir goes with it
        assert not (tmp_path / "run" / name).exists()


@pytest.mark.slow  # prepares the offline datasets it compares with (the module's `datasets`): ~20 s on 2 cores
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


# --- end to end: prepare + data=offline against data=online on the same JSONL -------------------------------

def write_jsonl(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps({"input_ids": ids, "loss_mask": mask}) + "\n" for ids, mask in rows))
    return path


def metric_rows(run_dir: Path) -> list[dict]:
    """metrics.jsonl's train and val rows, in the order written."""
    return [r for r in read_rows(run_dir) if r["split"] in ("train", "val")]


def assert_same_metrics(run: Path, reference: Path, keys=("loss",), rel=1e-4) -> None:
    got, want = metric_rows(run), metric_rows(reference)
    assert [(r["split"], r["step"]) for r in got] == [(r["split"], r["step"]) for r in want]
    assert {r["split"] for r in got} == {"train", "val"}
    for a, b in zip(got, want):
        for key in keys:
            assert a[key] == pytest.approx(b[key], rel=rel), f"{a['split']} step {a['step']}: {key}"


@pytest.fixture(scope="module")
def prepared_fp32(verifier, rows, tmp_path_factory) -> tuple[Path, Path]:
    """The rows as a JSONL, and prepared from it as the README says (`python -m eagle3.data.prepare`'s own main,
    in this process: one interpreter start less)."""
    from eagle3.cli.prepare import main

    tmp = tmp_path_factory.mktemp("online-e2e")
    jsonl = write_jsonl(tmp / "rows.jsonl", rows)
    assert main(["--model", str(verifier), "--data", str(jsonl), "--out", str(tmp / "ds"), "--dtype", "float32",
                 "--device", "cpu"]) == 0
    return jsonl, tmp / "ds"


# grad_accum=2: one process takes the same global batch as 2 DDP ranks (eagle3/data/loader.py), so the 2-rank
# online run is compared with the same offline run as the one-process online run.
E2E = ["model=auto", "data.total_seq_len=64", f"data.train_ratio={RATIO}", "optim.max_steps=6", "optim.eval_every=3",
       "logger.log_every=1", "logger.mode=disabled"]
ONE_PROCESS = ["optim.grad_accum=2"]
DDP = ["distributed=ddp", "distributed.nproc_per_node=2"]


@pytest.mark.slow
def test_an_online_ddp_run_has_the_offline_runs_losses(verifier, prepared_fp32, tmp_path):
    jsonl, data = prepared_fp32
    offline = ["data=offline", f"data.path={data}"]
    online = ["data=online", f"data.path={jsonl}", "data.hidden_states_dtype=float32"]
    # One process online is the tiny default's test below (data=online against data=tiny, equal at every step).
    runs = {"offline": [*offline, *ONE_PROCESS], "online_ddp": [*online, *DDP]}
    for name, args in runs.items():
        proc = launch([f"hydra.run.dir={tmp_path / name}", f"model.verifier.path={verifier}", *E2E, *args],
                      tmp_path / "cache")  # two ranks: processes of their own
        assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "online_ddp" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 6
    steps = [(r["split"], r["step"]) for r in metric_rows(tmp_path / "offline")]
    assert steps == [("val", 0), ("train", 1), ("train", 2), ("train", 3), ("val", 3), ("train", 4), ("train", 5),
                     ("train", 6), ("val", 6)]
    assert_same_metrics(tmp_path / "online_ddp", tmp_path / "offline")
    assert not list(tmp_path.rglob("hs_*.safetensors"))  # in the cache or any run dir


# --- the tiny default online: data=tiny's metrics, no hidden state on disk; resumed mid-epoch ----------------

TINY = [*SMALL_DATA, "optim.max_steps=8", "optim.eval_every=4", "logger.log_every=1", "logger.mode=disabled"]
VAL_METRICS = ("loss", "tau_sim")


@pytest.fixture(scope="module")
def tiny_online(tmp_path_factory) -> tuple[Path, Path]:
    """`launch.py data=online` on the tiny default, from an empty cache: its run dir and cache dir."""
    tmp = tmp_path_factory.mktemp("tiny-online")
    proc = launch([f"hydra.run.dir={tmp / 'run'}", "data=online", *TINY], tmp / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tmp / "run", tmp / "cache"


def val_summary(run_dir: Path) -> dict:
    """Step-0, best and final val metrics, as summary.json has them."""
    summary = json.loads((run_dir / "summary.json").read_text())
    return {k: summary[k] for k in ("step0", "best", "final")}


@pytest.mark.slow
def test_tiny_online_trains_to_data_tiny_metrics_and_writes_no_hidden_state(tiny_online, cache_dir, tmp_path):
    run, online_cache = tiny_online
    proc = launch([f"hydra.run.dir={tmp_path / 'tiny'}", "data=tiny", *TINY], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    online, offline = val_summary(run), val_summary(tmp_path / "tiny")
    for when in ("step0", "best", "final"):
        for key in VAL_METRICS:
            assert online[when][key] == pytest.approx(offline[when][key], rel=1e-4), f"{when} {key}"
    assert online["best"]["step"] == offline["best"]["step"]
    assert_same_metrics(run, tmp_path / "tiny")
    assert not list(run.rglob("hs_*.safetensors")) and not list(online_cache.rglob("hs_*.safetensors"))
    assert list(cache_dir.rglob("hs_*.safetensors"))  # data=tiny's are on disk: the search above can find them


@pytest.mark.slow
def test_online_run_stopped_mid_epoch_resumes_to_the_uninterrupted_metrics(tiny_online, tmp_path):
    from eagle3.init.checkpoint import load_trainer_state

    reference, cache = tiny_online
    run_dir = tmp_path / "run"
    stopped = sigterm_in_process_after_step_1([f"hydra.run.dir={run_dir}", "data=online", *TINY], cache)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr[-3000:]
    progress = load_trainer_state(run_dir / "checkpoints" / "last")["progress"]
    assert progress["epoch"] == 0 and 0 < progress["step_in_epoch"] == progress["step"] < 8, progress  # mid-epoch
    resumed = launch([f"resume={run_dir}"], cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_same_metrics(run_dir, reference, keys=("loss",), rel=1e-6)
    assert val_summary(run_dir) == val_summary(reference)


@pytest.mark.slow
def test_an_online_run_of_two_epochs_with_data_cache_gb_has_the_uncached_losses_and_leaves_no_cache(tmp_path):
    """data.cache_gb on the tiny default: two epochs, the second reading the first's train rows back (the loader
    test above counts the verifier's rows), give the losses of the run that computes every epoch (the first epoch's
    bit for bit, the later ones up to fp32's last bits under packing, rounded to bf16: equal here), and the cache
    is gone from the run dir at the end."""
    args = ["data=online", "data.synth.num_samples=32", "data.synth.response_len=48", "data.total_seq_len=512",
            "optim.epochs=2", "logger.log_every=1", "logger.mode=disabled"]
    for name, extra in [("uncached", []), ("cached", ["data.cache_gb=1"])]:
        proc = launch([f"hydra.run.dir={tmp_path / name}", *args, *extra], tmp_path / "cache")
        assert proc.returncode == 0, proc.stderr[-3000:]
    cached, uncached = metric_rows(tmp_path / "cached"), metric_rows(tmp_path / "uncached")
    assert [(r["step"], r["split"]) for r in cached] == [(r["step"], r["split"]) for r in uncached]
    assert max(r["epoch"] for r in cached if r["split"] == "train") == 1
    for a, b in zip(cached, uncached, strict=True):
        assert a["loss"] == (b["loss"] if a["epoch"] == 0 else pytest.approx(b["loss"], rel=1e-5)), a
    assert not (tmp_path / "cached" / "online_hidden_cache").exists()
