"""The tiny default's data: random prompts continued by sampling from the verifier itself (like regenerated
responses), with their hidden states, built on first use and cached under the sampling parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from eagle3.config import SynthConfig
from eagle3.data.cache import build_once, cache_key
from eagle3.data.jsonl import Row
from eagle3.data.prepare import write_dataset
from eagle3.data.verifier_forward import load_causal_lm
from eagle3.errors import DataError


@torch.no_grad()
def sample_rows(model: torch.nn.Module, synth: SynthConfig) -> list[Row]:
    """Random prompts (masked out of the loss) continued by sampling from `model` itself."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(synth.seed)
    rows: list[Row] = []
    n, bs = synth.num_samples, synth.batch_size
    for start in tqdm(range(0, n, bs), desc="sampling sequences", unit="batch", leave=False):
        prompt = torch.randint(0, vocab, (min(bs, n - start), synth.prompt_len), generator=gen)
        ids = _sample(model, prompt, synth.response_len, synth.temperature, gen)
        mask = [0] * synth.prompt_len + [1] * synth.response_len
        rows.extend((seq, mask) for seq in ids.tolist())
    return rows


def _sample(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, temperature: float,
            gen: torch.Generator) -> torch.Tensor:
    device = next(model.parameters()).device
    out = model(input_ids=prompt.to(device), use_cache=True)
    tokens = [prompt]
    for _ in range(new_tokens):
        probs = torch.softmax(out.logits[:, -1].float().cpu() / temperature, dim=-1)
        if not torch.isfinite(probs).all():  # torch.multinomial would fail with a traceback
            raise DataError("the verifier's next-token probabilities are not finite (NaN or inf in its weights or "
                            "activations), so no sequence can be sampled from it; check model.verifier")
        nxt = torch.multinomial(probs, 1, generator=gen)
        tokens.append(nxt)
        out = model(input_ids=nxt.to(device), past_key_values=out.past_key_values, use_cache=True)
    return torch.cat(tokens, dim=1)


def synthetic_dataset_dir(verifier_dir: Path, synth: SynthConfig, aux_layer_ids: Sequence[int],
                          cache_dir: str, dtype: str = "bfloat16") -> Path:
    """The dataset sampled from `verifier_dir` as `synth` says, built on first use and cached by its parameters."""
    params = {"verifier": str(verifier_dir), "synth": asdict(synth), "aux_layer_ids": list(aux_layer_ids),
              "dtype": dtype}
    target = Path(cache_dir) / "datasets" / f"synth-{cache_key(params)}"

    def build(tmp: Path) -> None:
        model = load_causal_lm(verifier_dir)
        rows = sample_rows(model, synth)
        write_dataset(model, verifier_dir, rows, tmp, aux_layer_ids, dtype=getattr(torch, dtype),
                      batch_tokens=synth.batch_size * (synth.prompt_len + synth.response_len))

    return build_once(target, build, what="synthetic dataset")
