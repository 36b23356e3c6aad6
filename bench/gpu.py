"""Training throughput of one draft at a realistic shape: this trainer against speculators' stock Trainer.

    python bench/gpu.py            # on a GPU: hidden 4096, vocab 128256, draft vocab 32000, 3 aux layers,
                                   # packed batches of 8192 tokens, bf16 autocast (Llama-3-8B's draft shape)
    python bench/gpu.py --small    # a CPU-sized shape; the test suite runs it (the stock Trainer is CUDA-only)

Both train the same draft (copies of one random initialization; speculators' forward is torch.compiled on
CUDA for both) on the same pre-built random batches, with AdamW, a scheduler and clipping. After warm-up
steps (compilation included there) each times the same number of steps; tokens/s, model FLOP utilisation
and the ratio are printed, and written as JSON with --json.

Model FLOPs count the matrix multiplies per token and TTT step: 6x the trainable weights (forward,
backward to inputs and to weights), 4x the frozen draft lm_head (forward and backward to its input), 2x the
verifier head that makes the targets; attention scores are left out, so MFU is a slight underestimate.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "gpu": dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256, draft_vocab=32000,
                seq=8192, doc=2048),
    "small": dict(hidden=64, intermediate=128, heads=4, kv_heads=4, head_dim=16, vocab=1024, draft_vocab=256,
                  seq=512, doc=128),
}


def build(shape: dict, device, seed: int = 0, attn_impl: str | None = None):
    """A draft at `shape` with random weights; flex attention on CUDA (as training there), sdpa elsewhere, unless
    `attn_impl` says otherwise."""
    from bench.common import random_draft
    from eagle3.config import DraftConfig
    from eagle3.device.choice import attn_impl_on

    draft = {"vocab_size": shape["vocab"], "hidden_size": shape["hidden"], "intermediate_size": shape["intermediate"],
             "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"],
             "head_dim": shape["head_dim"], "max_position_embeddings": shape["seq"] + 16, "rope_theta": 500000.0,
             "rms_norm_eps": 1e-5, "hidden_act": "silu", "draft_vocab_size": shape["draft_vocab"],
             "aux_layer_ids": [2, 16, 29], "ttt_steps": 3}
    attn_impl = attn_impl or attn_impl_on("auto", device.type)
    model = random_draft(DraftConfig(**draft), attn_impl, std=0.02, seed=seed)
    return model, draft


def batches(shape: dict, n: int, seed: int = 1, distinct: int = 2) -> list[dict]:
    """`n` packed batches cycling through `distinct` random ones (random data times as well as real data)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    t, h, docs = shape["seq"], shape["hidden"], shape["seq"] // shape["doc"]
    out = []
    for _ in range(min(n, distinct)):
        out.append({
            "hidden_states": torch.randn(1, t, 3 * h, generator=gen).to(torch.bfloat16),
            "verifier_last_hidden_states": torch.randn(1, t, h, generator=gen).to(torch.bfloat16),
            "input_ids": torch.randint(0, shape["vocab"], (1, t), generator=gen),
            "loss_mask": torch.ones(1, t, dtype=torch.long),
            "position_ids": (torch.arange(t) % shape["doc"] + 1)[None],
            "document_ids": torch.arange(docs).repeat_interleave(shape["doc"])[None],
            "error_records": 0,
        })
    return [out[i % len(out)] for i in range(n)]


def model_flops_per_token(draft: dict, model) -> float:
    frozen_head = draft["draft_vocab_size"] * draft["hidden_size"]
    trainable = sum(p.numel() for n, p in model.named_parameters() if p.requires_grad and p.dim() == 2)
    return draft["ttt_steps"] * (6 * trainable + 4 * frozen_head + 2 * frozen_head)


def time_ours(model, draft, data, steps, warmup, device):
    import torch
    from speculators.losses import resolve_loss_config

    from eagle3.config import LoggerConfig, LoggerMode
    from eagle3.device.choice import compute_dtype_on, loss_impl_on
    from eagle3.device.distributed import World
    from eagle3.rundir.progress import Progress
    from eagle3.train.loop import StepParts, count_step, log_train_row, make_scheduler, train_step
    from eagle3.train.track import Tracker
    from eagle3.train.train_rows import StepLog

    model = model.to(device)
    if device.type == "cpu":
        model = model.float()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    scheduler = make_scheduler(optimizer, "linear", 0, 10**6)
    kwargs = {"ttt_steps": draft["ttt_steps"], "ttt_step_loss_decay": 1.0,
              "loss_config": resolve_loss_config("kl_div", loss_impl_on(device.type))}
    dtype = getattr(torch, compute_dtype_on(device.type))
    autocast = torch.autocast("cuda", dtype=dtype) if device.type == "cuda" else nullcontext()
    run_dir = Path(tempfile.mkdtemp(prefix="eagle3-gpu-bench-"))
    tracker = Tracker(run_dir, LoggerConfig(mode=LoggerMode.disabled)).__enter__()
    progress = Progress()
    log = StepLog(tracker, World(), scheduler, warmup + steps, progress)
    parts = StepParts(model, optimizer, scheduler, params, 1, 1.0, device, autocast, kwargs)

    def step(batch):
        if device.type == "cpu":
            batch = {k: (v.float() if hasattr(v, "is_floating_point") and v.is_floating_point() else v)
                     for k, v in batch.items()}
        grad_norm = train_step(parts, iter([batch]), log.window)
        count_step(progress, grad_norm, 0, 1, World())  # what the loop does after each step
        log.count(grad_norm)
        if progress.step % 10 == 0:  # a train row every 10 steps, as log_every=10 gives
            log_train_row(log, progress, World())

    for batch in data[:warmup]:
        step(batch)
    sync(device)
    start = time.perf_counter()
    for batch in data[warmup:warmup + steps]:
        step(batch)
    sync(device)
    elapsed = time.perf_counter() - start
    log.close()
    tracker.__exit__(None, None, None)
    return elapsed


def time_stock(model, draft, data, steps, warmup, device):
    """speculators' Trainer as its CLI runs it on one GPU (no process group), timed over train_epoch."""
    import torch
    from speculators.losses import resolve_loss_config
    from speculators.train.trainer import Trainer, TrainerConfig

    kwargs = {"ttt_steps": draft["ttt_steps"], "ttt_step_loss_decay": 1.0,
              "loss_config": resolve_loss_config("kl_div", "fused")}
    config = TrainerConfig(lr=1e-4, num_epochs=1, save_path=tempfile.mkdtemp(prefix="eagle3-stock-"),
                           train_call_kwargs=kwargs, val_call_kwargs=kwargs, optimizer="adamw", weight_decay=0.0,
                           scheduler_type="linear", hidden_states_dtype=torch.bfloat16, log_freq=10)

    def loader(items):
        return torch.utils.data.DataLoader(items, batch_size=None, collate_fn=lambda b: b)

    trainer = Trainer(model, config, loader(data[:warmup]), None)
    trainer.train_epoch(0)
    sync(device)
    trainer.train_loader = loader(data[warmup:warmup + steps])
    start = time.perf_counter()
    trainer.train_epoch(1)
    sync(device)
    return time.perf_counter() - start


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="the CPU-sized shape")
    parser.add_argument("--steps", type=int, default=20, help="timed steps of each trainer")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation happens here)")
    parser.add_argument("--peak-tflops", type=float, default=989.0,
                        help="the device's dense bf16 peak (H100/H200: 989)")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    import torch

    from eagle3.console import quiet_libraries
    from eagle3.device.choice import resolve_runtime

    quiet_libraries()
    device = resolve_runtime("auto").device()
    shape = SHAPES["small" if args.small or device.type == "cpu" else "gpu"]
    model, draft = build(shape, device)
    flops = model_flops_per_token(draft, model)
    data = batches(shape, args.warmup + args.steps)
    tokens = args.steps * shape["seq"]
    stock_model = copy.deepcopy(model)
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "shape": shape,
              "steps": args.steps, "model_gflops_per_token": flops / 1e9, "torch": torch.__version__}
    ours = time_ours(model, draft, data, args.steps, args.warmup, device)
    result["eagle3_tokens_per_s"] = tokens / ours
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
        stock = time_stock(stock_model, draft, data, args.steps, args.warmup, device)
        result["stock_tokens_per_s"] = tokens / stock
        result["ratio_eagle3_over_stock"] = result["eagle3_tokens_per_s"] / result["stock_tokens_per_s"]
        for name in ("eagle3", "stock"):
            result[f"{name}_mfu"] = result[f"{name}_tokens_per_s"] * flops / (args.peak_tflops * 1e12)
    print(f"device {result['device']}, shape {shape}, {args.steps} timed steps after {args.warmup} warm-up")
    print(f"model FLOPs per token: {flops / 1e9:.2f} GFLOP")
    print(f"eagle3 trainer: {result['eagle3_tokens_per_s']:12.0f} tokens/s"
          + (f"   MFU {result['eagle3_mfu']:.3f}" if "eagle3_mfu" in result else ""))
    if "stock_tokens_per_s" in result:
        print(f"stock Trainer:  {result['stock_tokens_per_s']:12.0f} tokens/s   MFU {result['stock_mfu']:.3f}")
        print(f"ratio eagle3 / stock: {result['ratio_eagle3_over_stock']:.3f}")
    else:
        print("stock Trainer: skipped (speculators' Trainer is CUDA-only)")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
