"""The plan's memory against the measured peak of a real training step on CPU (eagle3/plan/memory.py).

    python bench/plan_memory.py          # prints planned / measured at a few shapes; --json FILE writes them
    python bench/plan_memory.py --num-layers 2 --layer-type qwen3   # the same for another draft architecture
    python bench/plan_memory.py --kind peagle                       # a P-EAGLE draft (COD-sampled positions)
    python bench/plan_memory.py --kind dflash                       # a DFlash draft (anchor blocks, one pass)

Measured: one AdamW step (zero_grad, forward, backward, step) of a real Eagle3DraftModel after a first step
(so the optimizer state exists), under `LiveBytes`, a TorchDispatchMode that counts the bytes of every live
tensor storage: each op's outputs are registered once per storage with a weakref whose callback subtracts
them when the storage is freed; the parameters, buffers, gradients, optimizer state and the batch are
registered before the step. This counts what the tensors hold (what the CUDA caching allocator's
memory_allocated would report), not the allocator's cached or fragmented blocks, and works the same on CPU.
Planned: the plan's terms except the reader's ring (not part of the model step): parameters, buffers,
gradients, AdamW state, the batch's hidden states, activations and the largest transient.
"""

from __future__ import annotations

import argparse
import json
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (name, total_seq_len, ttt_steps, attention, gradient checkpointing)
SHAPES = [
    ("T512 k3 sdpa", 512, 3, "sdpa", False),
    ("T1024 k2 eager", 1024, 2, "eager", False),
    ("T768 k4 sdpa", 768, 4, "sdpa", False),
    ("T512 k3 sdpa ckpt", 512, 3, "sdpa", True),
    ("T1024 k2 eager ckpt", 1024, 2, "eager", True),
]
DRAFT = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4, head_dim=16,
             vocab_size=1024, draft_vocab_size=256, aux_layer_ids=[1, 2, 3], rope_theta=10000.0,
             rms_norm_eps=1e-6, hidden_act="silu")


def live_bytes_mode():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class LiveBytes(TorchDispatchMode):
        """Bytes of the live tensor storages created under it (and of those registered with `track`)."""

        def __init__(self):
            super().__init__()
            self.live, self.peak, self.refs = 0, 0, {}

        def track(self, *objs) -> None:
            for t in tree_leaves(objs):
                if isinstance(t, torch.Tensor):
                    self._add(t)

        def _add(self, t) -> None:
            st = t.untyped_storage()
            key = (st.data_ptr(), st.nbytes())
            if key[0] == 0 or key in self.refs:
                return

            def gone(_, key=key, n=key[1]):
                if self.refs.pop(key, None) is not None:
                    self.live -= n

            self.refs[key] = weakref.ref(st, gone)
            self.live += key[1]
            self.peak = max(self.peak, self.live)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.track(out)
            return out

    return LiveBytes()


def draft_config(seq: int, ttt_steps: int, attn: str, checkpointing: bool, **arch):
    """`arch`: model.draft's architecture keys (num_layers, layer_type)."""
    from eagle3.config import DraftConfig

    return DraftConfig(**DRAFT, max_position_embeddings=seq * 2 + 16, ttt_steps=ttt_steps, attn_impl=attn,
                       gradient_checkpointing=checkpointing, **arch)


def build_model(draft, seed: int = 0):
    """A real Eagle3DraftModel (or P-EAGLE draft) of `draft` on CPU with the frozen verifier parts filled, as
    training holds it."""
    from bench.common import random_draft
    from eagle3.arch.activation_checkpointing import recompute_decoder_layers

    model = random_draft(draft, draft.attn_impl, std=0.05, seed=seed)
    if draft.gradient_checkpointing:
        recompute_decoder_layers(model)
    return model


def make_batch(draft, seq: int, docs: int = 4, seed: int = 1) -> dict:
    import torch

    gen = torch.Generator().manual_seed(seed)
    h, n = draft.hidden_size, len(draft.aux_layer_ids)
    return {"hidden_states": torch.randn(1, seq, n * h, generator=gen),
            "verifier_last_hidden_states": torch.randn(1, seq, h, generator=gen),
            "input_ids": torch.randint(0, draft.vocab_size, (1, seq), generator=gen),
            "loss_mask": torch.ones(1, seq, dtype=torch.long),
            "position_ids": (torch.arange(seq) % (seq // docs) + 1)[None],
            "document_ids": torch.arange(docs).repeat_interleave(seq // docs)[None]}


def measure(draft, seq: int) -> tuple[int, float]:
    """Measured peak bytes of a training step (after a first one) and its loss."""
    import torch
    from speculators.losses import resolve_loss_config

    model = build_model(draft)
    batch = make_batch(draft, seq)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4)
    kwargs = dict(ttt_steps=draft.ttt_steps, ttt_step_loss_decay=1.0,
                  loss_config=resolve_loss_config("kl_div", "eager"))

    def step():
        optimizer.zero_grad(set_to_none=True)
        _, loss, _ = model(**batch, **kwargs)
        loss.backward()
        optimizer.step()
        return loss.item()

    step()
    tracker = live_bytes_mode()
    tracker.track(list(model.parameters()), list(model.buffers()), optimizer.state, batch)
    with tracker:
        loss = step()
    return tracker.peak, loss


def planned(draft, seq: int) -> int:
    from eagle3.config import DistributedConfig, HiddenStatesDtype, OptimConfig, TinyDataConfig
    from eagle3.data.sources import source_of
    from eagle3.plan.memory import make_plan
    from eagle3.plan.parts import Machine, PlannedRun, SourceFacts

    data = TinyDataConfig(total_seq_len=seq, hidden_states_dtype=HiddenStatesDtype.float32)
    run = PlannedRun(draft, data, OptimConfig(), DistributedConfig(name="single", node_rank=0, rdzv_endpoint=None))
    plan = make_plan(run, Machine("cpu"), SourceFacts(source_of(data).buffer_terms(draft, "cpu")))
    return sum(t.bytes for t in plan.terms if t.on_device and not t.name.startswith("hidden-state ring"))


def compare(name: str, seq: int, ttt_steps: int, attn: str, checkpointing: bool, **arch) -> dict:
    draft = draft_config(seq, ttt_steps, attn, checkpointing, **arch)
    measured, loss = measure(draft, seq)
    plan = planned(draft, seq)
    return {"shape": name, "total_seq_len": seq, "ttt_steps": ttt_steps, "attn_impl": attn,
            "gradient_checkpointing": checkpointing, "planned_bytes": plan, "measured_bytes": measured,
            "ratio": plan / measured, "loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--num-layers", type=int, default=1, help="the draft's decoder layers")
    parser.add_argument("--layer-type", choices=["llama", "qwen3"], default="llama", help="their type")
    parser.add_argument("--kind", choices=["eagle3", "peagle", "dflash"], default="eagle3", help="the draft kind")
    args = parser.parse_args()
    from eagle3.console import quiet_libraries

    quiet_libraries()
    from eagle3.config import DraftKind, LayerType

    arch = {"num_layers": args.num_layers, "layer_type": LayerType(args.layer_type), "kind": DraftKind(args.kind)}
    results = [compare(*shape, **arch) for shape in SHAPES]
    print(f"{'shape':<22} {'planned MiB':>12} {'measured MiB':>13} {'planned/measured':>17}")
    for r in results:
        print(f"{r['shape']:<22} {r['planned_bytes'] / 2**20:12.2f} {r['measured_bytes'] / 2**20:13.2f} "
              f"{r['ratio']:17.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
