"""Prepare EAGLE-3 training data from a local Hugging Face causal LM, in speculators' on-disk format.

    <out>/data-*.arrow + dataset_info.json + state.json    rows: input_ids, loss_mask, seq_len (torch format)
    <out>/hidden_states/hs_<i>.safetensors                  hidden_states [seq, n_aux + 1, H], token_ids [seq]
    <out>/token_freq.pt                                     {token_id: count} over loss-masked tokens

The aux slots are Hugging Face `output_hidden_states[i]` (the residual stream entering decoder layer i,
which is what vLLM's extract_hidden_states captures); the last slot is the final layer's output before
the final norm, because speculators applies the verifier's norm itself.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from eagle3.data.cache import build_once, cache_key

log = logging.getLogger(__name__)

Row = tuple[list[int], list[int]]  # (input_ids, loss_mask)


def load_causal_lm(model_dir: str | Path, device: str = "cpu") -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    return model.to(device).eval()


@torch.no_grad()
def sample_rows(model: torch.nn.Module, synth: dict[str, Any]) -> list[Row]:
    """Random prompts (masked out of the loss) continued by sampling from `model` itself."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(synth["seed"])
    rows: list[Row] = []
    n, bs = synth["num_samples"], synth["batch_size"]
    for start in tqdm(range(0, n, bs), desc="sampling sequences", unit="batch", leave=False):
        prompt = torch.randint(0, vocab, (min(bs, n - start), synth["prompt_len"]), generator=gen)
        ids = _sample(model, prompt, synth["response_len"], synth["temperature"], gen)
        mask = [0] * synth["prompt_len"] + [1] * synth["response_len"]
        rows.extend((seq, mask) for seq in ids.tolist())
    return rows


def _sample(model: torch.nn.Module, prompt: torch.Tensor, new_tokens: int, temperature: float,
            gen: torch.Generator) -> torch.Tensor:
    device = next(model.parameters()).device
    out = model(input_ids=prompt.to(device), use_cache=True)
    tokens = [prompt]
    for _ in range(new_tokens):
        probs = torch.softmax(out.logits[:, -1].float().cpu() / temperature, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen)
        tokens.append(nxt)
        out = model(input_ids=nxt.to(device), past_key_values=out.past_key_values, use_cache=True)
    return torch.cat(tokens, dim=1)


@torch.no_grad()
def write_dataset(model: torch.nn.Module, rows: Sequence[Row], out_dir: Path, aux_layer_ids: Sequence[int],
                  batch_size: int = 16, dtype: torch.dtype = torch.bfloat16) -> None:
    """Runs `model` over `rows` and writes them with their hidden states in speculators' format."""
    from datasets import Dataset
    from safetensors.torch import save_file
    from speculators.train.vocab_mapping import save_token_frequency_distribution

    num_layers = model.config.num_hidden_layers
    bad = [i for i in aux_layer_ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux layer ids {bad} are outside the verifier's {num_layers} layers")
    hs_dir = out_dir / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    pre_norm: list[torch.Tensor] = []
    hook = model.model.norm.register_forward_pre_hook(lambda _m, args: pre_norm.append(args[0]))
    device = next(model.parameters()).device
    try:
        for start in tqdm(range(0, len(rows), batch_size), desc="verifier hidden states", unit="batch", leave=False):
            chunk = rows[start:start + batch_size]
            lengths = [len(ids) for ids, _ in chunk]
            width = max(lengths)
            ids = torch.zeros(len(chunk), width, dtype=torch.long)
            attn = torch.zeros(len(chunk), width, dtype=torch.long)
            for b, (seq, _) in enumerate(chunk):  # right padding: causal attention keeps real positions exact
                ids[b, :len(seq)] = torch.tensor(seq)
                attn[b, :len(seq)] = 1
            pre_norm.clear()
            out = model(input_ids=ids.to(device), attention_mask=attn.to(device), output_hidden_states=True)
            layers = [out.hidden_states[i] for i in aux_layer_ids] + [pre_norm[-1]]
            stacked = torch.stack(layers, dim=2).to("cpu", dtype)  # [B, T, n_aux + 1, H]
            for b, n in enumerate(lengths):
                save_file({"hidden_states": stacked[b, :n].contiguous(), "token_ids": ids[b, :n].clone()},
                          str(hs_dir / f"hs_{start + b}.safetensors"))
    finally:
        hook.remove()
    dataset = Dataset.from_dict({
        "input_ids": [ids for ids, _ in rows],
        "loss_mask": [mask for _, mask in rows],
        "seq_len": [len(ids) for ids, _ in rows],
    }).with_format("torch")
    dataset.save_to_disk(str(out_dir))
    save_token_frequency_distribution(dataset, str(out_dir / "token_freq.pt"))


def synthetic_dataset_dir(verifier_dir: Path, synth: dict[str, Any], aux_layer_ids: Sequence[int],
                          cache_dir: str, dtype: str = "bfloat16") -> Path:
    """The dataset sampled from `verifier_dir` as `synth` says, built on first use and cached by its parameters."""
    params = {"verifier": str(verifier_dir), "synth": synth, "aux_layer_ids": list(aux_layer_ids), "dtype": dtype}
    target = Path(cache_dir) / "datasets" / f"synth-{cache_key(params)}"

    def build(tmp: Path) -> None:
        model = load_causal_lm(verifier_dir)
        rows = sample_rows(model, synth)
        write_dataset(model, rows, tmp, aux_layer_ids, batch_size=synth["batch_size"], dtype=getattr(torch, dtype))

    return build_once(target, build, what="synthetic dataset")
