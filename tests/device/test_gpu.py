"""The CUDA-only paths, at small shapes, for one GPU: training steps with the fused (Triton) loss, flex attention
and bf16 autocast (a packed length that is not whole 128-token blocks with 3 TTT steps included); the reader's
page-locked buffers and host-to-device copies; nccl with DDP and with FSDP2 at world size 1; checkpoints saved
there and loaded by speculators onto the GPU; eval.accept on CUDA (lossless); the launcher end to end.

Every test is marked `gpu` and skipped without CUDA (tests/conftest.py). `bench/gpu_check.sh` runs this tier on
a device machine: `python -m pytest -q -m gpu`.

World size 1 with DDP or FSDP2: the launcher runs one process in place and `World.distributed` (size > 1) turns
wrapping and collectives off, so `python launch.py distributed=ddp distributed.nproc_per_node=1` would train an
unwrapped model. Here a one-rank nccl group is joined through the real `init_world` and handed to the real
`run_rank` as a world that says it is distributed, so DDP, fully_shard, the collectives and the full state dicts
all run on one GPU.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from commands import launch
from eagle3.config import RunConfig, run_config
from factories import SMALL_DATA, compose_cfg, read_rows

pytestmark = [pytest.mark.gpu,
              pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")]

CUDA = torch.device("cuda", 0)
# 8 steps of 512 packed tokens per run: enough to see the loss fall, short enough for one device call.
QUICK = ["logger.mode=disabled", "logger.log_every=1", "optim.max_steps=8", *SMALL_DATA]
# Measured acceptance at every val pass, on the training draft (flex attention, on the GPU).
ACCEPT_AT_VAL = ["eval.accept.enabled=true", "eval.accept.num_prompts=4", "eval.accept.max_new_tokens=16"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_run_config(run_dir: Path, cache_dir: Path, overrides: list[str]) -> RunConfig:
    """The typed run config as the launcher hands it to a rank (minus the run dir's files)."""
    cfg = OmegaConf.to_container(compose_cfg([f"cache_dir={cache_dir}", *QUICK, *overrides]), resolve=True,
                                 enum_to_str=True)
    assert isinstance(cfg, dict)
    cfg["run"] = {"dir": str(run_dir), "name": run_dir.name, "group": "gpu", "choices": {}, "overrides": []}
    run_dir.mkdir(parents=True)
    return run_config(cfg)


class Spy:
    """Records what the rank really ran: the loss implementation, the wrapped model, and each micro-batch as it
    went to the device (its dtype and device, and whether its host buffer was page-locked)."""

    def __init__(self, monkeypatch):
        import speculators.losses

        import eagle3.train.loop
        import eagle3.train.rank
        import eagle3.train.validation

        self.loss_impls, self.models, self.batches = [], [], []
        resolve, wrap, to_device = (speculators.losses.resolve_loss_config, eagle3.train.rank.wrap_model,
                                    eagle3.train.loop.to_device)

        def spy_resolve(spec, implementation="fused"):
            self.loss_impls.append(implementation)
            return resolve(spec, implementation)

        def spy_wrap(model, world, device):
            wrapped = wrap(model, world, device)
            self.models.append(wrapped)
            return wrapped

        def spy_to_device(batch, device):
            out = to_device(batch, device)
            self.batches.append({"pinned": batch["hidden_buffer"].is_pinned(), "dtype": out["hidden_states"].dtype,
                                 "buffer_device": batch["hidden_buffer"].device,
                                 "device": out["hidden_states"].device, "length": out["input_ids"].shape[1]})
            return out

        monkeypatch.setattr(speculators.losses, "resolve_loss_config", spy_resolve)
        monkeypatch.setattr(eagle3.train.rank, "wrap_model", spy_wrap)
        monkeypatch.setattr(eagle3.train.loop, "to_device", spy_to_device)  # the train steps'
        monkeypatch.setattr(eagle3.train.validation, "to_device", spy_to_device)  # the val passes'

    def autocast_dtypes(self) -> set:
        """Output dtypes of the draft's fc layer in the forwards since this was called (bf16 under autocast)."""
        from eagle3.device.distributed import unwrap

        dtypes: set = set()
        unwrap(self.models[-1]).fc.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
        return dtypes


def train_on_gpu(cfg: RunConfig, monkeypatch, one_rank_group: bool = False) -> tuple[dict, Spy, Path, Path]:
    """Runs one rank in this process as the launcher would, on the GPU; returns (summary, spy, verifier, data)."""
    import eagle3.train.rank
    from eagle3.device.distributed import World, init_world
    from eagle3.run.inputs import check_data, materialize_inputs

    verifier_dir, data_dir = materialize_inputs(cfg)
    check_data(cfg, verifier_dir, data_dir)
    spy = Spy(monkeypatch)
    if one_rank_group:
        for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "RANK": "0",
                           "LOCAL_RANK": "0", "WORLD_SIZE": "1"}.items():
            monkeypatch.setenv(key, value)

        @dataclass(frozen=True)
        class OneRankGroup(World):
            @property
            def distributed(self) -> bool:
                return True

        def join(strategy, backend, device_type):
            world = init_world(strategy, backend, device_type)  # as eagle3.device.choice resolved it
            assert torch.distributed.get_backend() == ("nccl" if device_type == "cuda" else "gloo")
            return OneRankGroup(world.rank, world.local_rank, world.size, strategy)

        monkeypatch.setattr(eagle3.train.rank, "init_world", join)
    summary = eagle3.train.rank.run_rank(cfg, verifier_dir, data_dir)
    assert summary is not None and not torch.distributed.is_initialized()  # the rank closed its group
    return summary.to_dict(), spy, verifier_dir, data_dir


def assert_trained_on_cuda(summary: dict, spy: Spy, length: int) -> None:
    assert summary["device"] == "cuda:0" and summary["steps"] == 8
    assert summary["final"]["loss"] < summary["step0"]["loss"]
    assert spy.loss_impls[0] == "fused"  # the trainer's: speculators' Triton loss
    from eagle3.device.distributed import unwrap

    assert unwrap(spy.models[-1])._attn_impl == "simple_flex_attention"
    assert spy.batches and all(b["pinned"] and b["device"].type == "cuda" and b["dtype"] == torch.bfloat16
                               and b["length"] == length for b in spy.batches)


def val_loss_of(checkpoint: Path, cfg: RunConfig, data_dir: Path, total_seq_len: int | None = None,
                device: torch.device = CUDA) -> dict:
    """Val metrics of a checkpoint loaded by speculators onto `device`, as the trainer computes them there
    (`total_seq_len`: the packed length the run trained with, when it differs from data.total_seq_len)."""
    from contextlib import nullcontext

    from speculators.losses import resolve_loss_config

    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.device.choice import attn_impl_on
    from eagle3.init.checkpoint import load_draft
    from eagle3.train.validation import run_validation

    draft, cuda = cfg.model.draft, device.type == "cuda"
    model = load_draft(checkpoint, "simple_flex_attention" if cuda else attn_impl_on(draft.attn_impl, "cpu"),
                       device=device)
    assert next(model.parameters()).device == device
    _, val = build_loaders(data_dir, LoaderSpec(total_seq_len or cfg.data.total_seq_len, draft.hidden_size,
                                                len(draft.aux_layer_ids), cfg.data.train_ratio, cfg.seed,
                                                device=device))
    kwargs = {"ttt_steps": draft.ttt_steps, "ttt_step_loss_decay": draft.ttt_step_loss_decay,
              "loss_config": resolve_loss_config(draft.loss, "fused" if cuda else "eager")}
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else nullcontext()
    return run_validation(model, val, device, autocast, kwargs)


# First: the cheapest, so that a device call cut short by its time limit still has it.
def test_pinned_reader_never_overwrites_a_batch_whose_copy_is_still_queued(tmp_path):
    """The copy from a page-locked buffer runs when the GPU gets to it. Here the GPU is kept busy before each
    copy is queued and the next batch is asked for at once: the reader must wait for that copy before refilling
    the buffer, so every batch on the GPU still equals speculators' own for its rows."""
    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.data.reader import to_device
    from factories import AUX, RATIO, H, Speculators, T, passes, write_dataset

    data = write_dataset(tmp_path / "bf16", torch.bfloat16)
    train, _ = build_loaders(data, LoaderSpec(T, H, AUX, RATIO, seed=0, prefetch=2, device=CUDA))
    ref = Speculators(data, torch.bfloat16)
    on_gpu = []
    for rows, batch in passes(train):
        assert batch["hidden_buffer"].is_pinned()
        torch.cuda._sleep(20_000_000)  # about 10 ms of GPU time queued before the copy
        on_gpu.append((rows, to_device(batch, CUDA)))
    torch.cuda.synchronize()
    assert len(on_gpu) > len(train.ring) == 3
    for rows, got in on_gpu:
        want = ref.batch(rows)
        assert sorted(got) == sorted(want)
        for k, v in want.items():
            assert got[k].device == CUDA and got[k].dtype == v.dtype, k
            assert torch.equal(got[k].cpu(), v), k


@pytest.fixture(scope="module")
def gpu_run(cache_dir, tmp_path_factory):
    """One single-GPU run with data.total_seq_len=200 (not whole 128-token blocks) and 3 TTT steps, with
    eval.accept at every val pass: (run dir, config, summary, spy records, verifier dir, data dir)."""
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_dir = tmp_path_factory.mktemp("gpu") / "single"
        cfg = gpu_run_config(run_dir, cache_dir, ["data.total_seq_len=200", "model.draft.ttt_steps=3",
                                                  *ACCEPT_AT_VAL])
        summary, spy, verifier_dir, data_dir = train_on_gpu(cfg, monkeypatch)
    finally:
        monkeypatch.undo()
    return run_dir, cfg, summary, spy, verifier_dir, data_dir


def test_fused_loss_flex_attention_and_bf16_autocast_at_a_length_off_the_block_size(gpu_run):
    run_dir, cfg, summary, spy, _, _ = gpu_run
    assert cfg.data.total_seq_len == 200
    assert_trained_on_cuda(summary, spy, length=256)  # rounded up to whole flex blocks (eagle3.arch.packing.packed_len)
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in read_rows(run_dir))


def test_bf16_autocast_reaches_the_draft(gpu_run):
    """The trainer's forward on CUDA computes in bf16 (fc's output) on fp32 master weights."""
    from speculators.losses import resolve_loss_config

    from eagle3.data.loader import LoaderSpec, build_loaders
    from eagle3.train.validation import run_validation

    _, cfg, _, spy, _, data_dir = gpu_run
    model = spy.models[-1]
    assert model.fc.weight.dtype == torch.float32 and model.fc.weight.device == CUDA
    dtypes = spy.autocast_dtypes()
    draft = cfg.model.draft
    _, val = build_loaders(data_dir, LoaderSpec(256, draft.hidden_size, len(draft.aux_layer_ids), cfg.data.train_ratio,
                                                cfg.seed, device=CUDA))
    kwargs = {"ttt_steps": draft.ttt_steps, "ttt_step_loss_decay": draft.ttt_step_loss_decay,
              "loss_config": resolve_loss_config(draft.loss, "fused")}
    metrics = run_validation(model, val, CUDA, torch.autocast("cuda", dtype=torch.bfloat16), kwargs)
    assert dtypes == {torch.bfloat16} and torch.isfinite(torch.tensor(metrics["loss"]))


def test_accept_at_val_on_cuda_is_lossless(gpu_run):
    run_dir, _, _, _, _, _ = gpu_run
    val_rows = [r for r in read_rows(run_dir) if r["split"] == "val"]
    assert len(val_rows) == 2  # step 0 and step 8
    for row in val_rows:
        assert row.get("accept_lossless", True) is not False, row  # a failed check is logged, not raised
        assert row["accept_len"] >= 1.0


def test_checkpoint_loads_with_speculators_on_the_gpu_and_reproduces_val(gpu_run):
    run_dir, cfg, summary, _, _, data_dir = gpu_run
    metrics = val_loss_of(run_dir / "checkpoints" / "last", cfg, data_dir, total_seq_len=256)  # the packed length
    assert metrics["loss"] == pytest.approx(summary["final"]["loss"], rel=1e-3)
    assert metrics["tau_sim"] == pytest.approx(summary["final"]["tau_sim"], abs=5e-3)


def test_eval_accept_cli_on_cuda_is_lossless(gpu_run, tmp_path):
    from eagle3.cli.accept import parse_args
    from eagle3.eval.accept import AcceptRequest, run
    from eagle3.eval.prompts import val_split_prompts

    run_dir, cfg, summary, _, verifier_dir, data_dir = gpu_run
    prompts = tmp_path / "prompts.jsonl"
    rows = val_split_prompts(data_dir, cfg.data.train_ratio, 4)
    prompts.write_text("".join(json.dumps({"input_ids": list(map(int, p))}) + "\n" for p in rows))
    args = parse_args([str(run_dir / "checkpoints" / "best"), "--verifier", str(verifier_dir), "--prompts",
                       str(prompts), "--device", "cuda", "--max-new-tokens", "24",
                       "--out", str(tmp_path / "accept.json")])
    report = run(AcceptRequest(**vars(args)))
    assert report["device"] == "cuda" and report["lossless"] is True  # run() raises LosslessError otherwise
    assert report["prompts"] == 4 and 1.0 <= report["accept_len"] <= 1 + report["k"]
    assert json.loads((tmp_path / "accept.json").read_text())["accept_len"] == report["accept_len"]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_nccl_world_size_one_trains_saves_and_speculators_loads(strategy, cache_dir, tmp_path, monkeypatch):
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    run_dir = tmp_path / strategy
    cfg = gpu_run_config(run_dir, cache_dir, [f"distributed={strategy}", "distributed.nproc_per_node=1"])
    summary, spy, _, data_dir = train_on_gpu(cfg, monkeypatch, one_rank_group=True)
    assert_trained_on_cuda(summary, spy, length=512)
    assert isinstance(spy.models[-1], DistributedDataParallel if strategy == "ddp" else FSDPModule)
    assert summary["world_size"] == 1
    # Saved through the full (gathered) state dicts: speculators loads `last` onto the GPU, and its val loss is
    # the run's final one (FSDP2 computed in bf16 parameters, the loaded model in fp32 under autocast).
    metrics = val_loss_of(run_dir / "checkpoints" / "last", cfg, data_dir)
    assert metrics["loss"] == pytest.approx(summary["final"]["loss"], rel=1e-3 if strategy == "ddp" else 2e-2)
    from eagle3.init.checkpoint import load_trainer_state

    state = load_trainer_state(run_dir / "checkpoints" / "last")
    assert state["progress"]["step"] == 8 and state["optimizer"]["state"]


def test_online_data_on_the_gpu(cache_dir, tmp_path, monkeypatch):
    """data=online on CUDA: the verifier, loaded once in bf16 on the GPU, computes each micro-batch's hidden states
    there (the buffer never leaves the device), the draft trains with the fused loss and flex attention, and
    eval.accept measures with that same verifier."""
    import eagle3.data.online

    loaded = []
    load = eagle3.data.online.load_online_verifier

    def spy_load(*args, **kwargs):
        loaded.append(load(*args, **kwargs))
        return loaded[-1]

    monkeypatch.setattr(eagle3.data.online, "load_online_verifier", spy_load)
    cfg = gpu_run_config(tmp_path / "online", cache_dir, ["data=online", *ACCEPT_AT_VAL])
    summary, spy, _, _ = train_on_gpu(cfg, monkeypatch)
    # eval.accept measured with the run's own bf16 verifier: bf16 near-ties are counted, not failures.
    val_rows = [r for r in read_rows(tmp_path / "online") if r["split"] == "val"]
    assert len(val_rows) == 2 and all(r["accept_len"] >= 1.0 for r in val_rows), val_rows
    assert summary["device"] == "cuda:0" and summary["steps"] == 8
    assert summary["final"]["loss"] < summary["step0"]["loss"]
    assert spy.loss_impls[0] == "fused"
    (verifier,) = loaded
    weight = next(verifier.model.parameters())
    assert weight.device == CUDA and weight.dtype == torch.bfloat16 and verifier.forward_s > 0
    assert spy.batches and all(b["buffer_device"] == CUDA and b["dtype"] == torch.bfloat16 and b["length"] == 512
                               for b in spy.batches)


@pytest.mark.slow
def test_launcher_end_to_end_on_the_gpu(cache_dir, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch([f"hydra.run.dir={run_dir}", *QUICK], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["device"] == "cuda:0" and summary["steps"] == 8
    assert summary["final"]["loss"] < summary["step0"]["loss"]
    assert (run_dir / "checkpoints" / "best" / "model.safetensors").is_file()
    assert os.path.isdir(summary["data_dir"])
