"""The training data path against reading the same hidden-state bytes from the page cache.

    python bench/loader.py [--files 24] [--passes 9] [--dir /tmp/eagle3-bench-loader] [--json out.json]
    python bench/loader.py --small      # a tiny shape in seconds; the test suite runs it

The dataset (speculators' format, built once under --dir and reused) has `--files` training rows of 2048
tokens whose hidden states are bf16 [2048, 4, 4096] (hidden 4096, 3 aux layers + the last: 64 MiB a
file), plus one short validation row.

Raw read: each training file's hidden_states bytes, `readinto` one reused buffer at the tensor's offset
(taken from the safetensors header beforehand): what one thread gets from the page cache, the ceiling.
Data path: eagle3.data.loader.build_loaders as the trainer builds it (total_seq_len 2048, one rank, the
default prefetch), and per micro-batch what the trainer does up to the model's inputs: on CUDA
eagle3.data.reader.to_device (the host-to-device copy; synchronized before the clock stops); on CPU the
hidden-state views (eagle3.data.reader.split_hidden). The CPU trainer then casts them to float32; that
cast is the model's compute, not data loading, and is left out.

For reference, speculators' own reader on the same packs: its ArrowDataset items (safetensors load_file,
the aux-slot copy) through its CollateFn with shift_batch, in bf16 (on CUDA then moved to the device).

The sides take turns pass by pass over the same files (a first, untimed pass of each fills the page cache
and allocates the loader's buffers); tokens/s are medians (raw: bytes / ((aux layers + 1) * hidden * 2
bytes); the readers: real tokens, document_ids >= 0); a ratio is the median of the per-pass ratios to raw,
which cancels the machine's slow drifts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {
    "real": dict(files=24, seq=2048, hidden=4096, aux=3),
    "small": dict(files=4, seq=128, hidden=64, aux=3),
}
VAL_SEQ = 16


def build_dataset(root: Path, files: int, seq: int, hidden: int, aux: int) -> Path:
    """`files` training rows of `seq` tokens and one validation row, random bf16 hidden states; reused."""
    import torch
    from datasets import Dataset
    from safetensors.torch import save_file

    data_dir = root / f"files{files}-seq{seq}-hidden{hidden}-aux{aux}"
    done = data_dir / "complete"
    if done.exists():
        return data_dir
    (data_dir / "hidden_states").mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(0)
    lengths = [seq] * files + [VAL_SEQ]
    ids = [torch.randint(0, 32000, (n,), generator=gen) for n in lengths]
    for i, (n, tokens) in enumerate(zip(lengths, ids)):
        hs = torch.randn(n, aux + 1, hidden, generator=gen).to(torch.bfloat16)
        save_file({"hidden_states": hs, "token_ids": tokens}, str(data_dir / "hidden_states" / f"hs_{i}.safetensors"))
    Dataset.from_dict({"input_ids": [t.tolist() for t in ids], "loss_mask": [[1] * n for n in lengths],
                       "seq_len": lengths}).with_format("torch").save_to_disk(str(data_dir))
    done.touch()
    return data_dir


def hidden_offsets(paths: list[Path]) -> list[tuple[Path, int, int]]:
    """(path, start, size) of each file's hidden_states bytes, from its safetensors header."""
    import os

    from eagle3.formats.hidden_states import read_header

    out = []
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        spec = read_header(fd, path)["hidden_states"]
        os.close(fd)
        out.append((path, spec.start, spec.end - spec.start))
    return out


def raw_pass(files: list[tuple[Path, int, int]], buf: memoryview, bytes_per_token: int) -> float:
    start = time.perf_counter()
    total = 0
    for path, offset, size in files:
        with open(path, "rb", buffering=0) as f:
            f.seek(offset)
            total += f.readinto(buf[:size])
    return total / bytes_per_token / (time.perf_counter() - start)


def loader_pass(loader, epoch: int, device) -> float:
    import torch

    from eagle3.data.reader import split_hidden, to_device

    loader.batch_sampler.set_epoch(epoch)
    start = time.perf_counter()
    tokens = 0
    for batch in loader:
        if device.type == "cuda":
            inputs = to_device(batch, device)
        else:
            inputs = {**{k: v for k, v in batch.items() if k != "hidden_buffer"},
                      **split_hidden(batch["hidden_buffer"])}
        tokens += int((inputs["document_ids"] >= 0).sum())
    if device.type == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start)


def speculators_pass(items, collate, loader, epoch: int, device) -> float:
    """speculators' reader on the same packs: ArrowDataset items through CollateFn(shift_batch), in bf16."""
    import torch

    loader.batch_sampler.set_epoch(epoch)
    plan = list(loader.batch_sampler)
    start = time.perf_counter()
    tokens = 0
    for docs in plan:
        batch = collate([items[int(i)] for i in docs])
        inputs = {k: v.to(device, non_blocking=True) for k, v in batch.items() if isinstance(v, torch.Tensor)}
        tokens += int((inputs["document_ids"] >= 0).sum())
    if device.type == "cuda":
        torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="a tiny shape (4 files of 128 tokens, hidden 64)")
    parser.add_argument("--files", type=int, help="training files (default 24 = 1.5 GiB; keep them within RAM)")
    parser.add_argument("--passes", type=int, default=9, help="timed passes of each side")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/eagle3-bench-loader"), help="where the dataset lives")
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    args = parser.parse_args()

    import torch
    from speculators.models.eagle3.data import shift_batch
    from speculators.train.data import ArrowDataset, CollateFn

    from eagle3.console import quiet_libraries
    from eagle3.data.loader import LoaderSpec, build_loaders

    quiet_libraries()
    shape = dict(SHAPES["small" if args.small else "real"])
    if args.files:
        shape["files"] = args.files
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    data_dir = build_dataset(args.dir, **shape)
    n = shape["files"]
    files = hidden_offsets([data_dir / "hidden_states" / f"hs_{i}.safetensors" for i in range(n)])
    buf = memoryview(bytearray(max(size for _, _, size in files)))  # bytearray() zero-fills: pages touched now
    bytes_per_token = (shape["aux"] + 1) * shape["hidden"] * 2
    # Every training row, and only those, in the training split: int((n + 1) * ratio) == n.
    ratio = (n + 0.5) / (n + 1)
    loader, _ = build_loaders(data_dir, LoaderSpec(shape["seq"], shape["hidden"], shape["aux"], ratio, seed=0,
                                                   device=device))
    items = ArrowDataset(max_len=shape["seq"], datapath=str(data_dir), on_missing="raise", train_ratio=ratio,
                         split="train", hidden_states_dtype=torch.bfloat16)
    collate = CollateFn(shape["seq"], shape["hidden"], num_target_layers=shape["aux"], dtype=torch.bfloat16,
                        preprocess=shift_batch)
    sides = {
        "raw": lambda p: raw_pass(files, buf, bytes_per_token),
        "loader": lambda p: loader_pass(loader, p, device),
        "speculators": lambda p: speculators_pass(items, collate, loader, p, device),
    }
    for run in sides.values():  # the page cache now holds every file, and the loader's buffers exist
        run(0)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for p in range(args.passes):
        order = list(sides)[p % 3:] + list(sides)[:p % 3]
        for name in order:
            rates[name].append(sides[name](p + 1))
    med = {name: statistics.median(r) for name, r in rates.items()}
    ratios = {name: statistics.median(o / r for o, r in zip(rates[name], rates["raw"]))
              for name in ("loader", "speculators")}
    result = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu", "shape": shape,
              "passes": args.passes, "bytes_per_token": bytes_per_token, "torch": torch.__version__,
              **{f"{name}_tokens_per_s": med[name] for name in sides},
              **{f"{name}_gb_per_s": med[name] * bytes_per_token / 1e9 for name in sides},
              "ratio_loader_over_raw": ratios["loader"], "ratio_speculators_over_raw": ratios["speculators"]}
    print(f"{n} files of {shape['seq']} tokens, hidden {shape['hidden']}, {shape['aux']} aux layers + the last, bf16 "
          f"({bytes_per_token} bytes a token); {args.passes} passes each; device {result['device']}, "
          + ("data paths up to the device" if device.type == "cuda"
             else "data paths up to the model's inputs on the host"))
    labels = {"raw": "raw read (page cache)", "loader": "training data path", "speculators": "speculators' reader"}
    for name, label in labels.items():
        print(f"{label:24s}{med[name]:12.0f} tokens/s  {med[name] * bytes_per_token / 1e9:6.2f} GB/s   "
              f"(passes: {', '.join(f'{r:.0f}' for r in rates[name])})")
    print(f"ratio data path / raw: {ratios['loader']:.3f} (median of per-pass ratios; ratio of medians "
          f"{med['loader'] / med['raw']:.3f}); speculators' reader / raw: {ratios['speculators']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
