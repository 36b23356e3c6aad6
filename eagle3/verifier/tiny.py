"""The tiny verifier: a small Llama built deterministically from a seed and cached on disk.

A plain random init has near-uniform next-token distributions, so no draft could learn anything
from it; multiplying lm_head by `logit_scale` makes them peaked, as a trained model's are.
"""

from __future__ import annotations

import logging
from dataclasses import asdict
from pathlib import Path

import torch

from eagle3.config import TinyVerifierConfig
from eagle3.formats.cache import build_once, cache_key

log = logging.getLogger(__name__)


def tiny_verifier_dir(tiny: TinyVerifierConfig, cache_dir: str) -> Path:
    """Returns the directory of the tiny verifier described by `tiny`, building it on first use."""
    target = Path(cache_dir) / "verifiers" / f"tiny-{cache_key(asdict(tiny))}"
    return build_once(target, lambda tmp: _build(tiny, tmp), what="tiny verifier")


def _build(tiny: TinyVerifierConfig, out_dir: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tiny.vocab_size,
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=tiny.num_heads,
        num_key_value_heads=tiny.num_heads,
        max_position_embeddings=tiny.max_position_embeddings,
        initializer_range=tiny.init_std,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(tiny.seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(tiny.logit_scale)
        derive(model, tiny.perturb_std, tiny.token_shift, tiny.perturb_seed)
    model.save_pretrained(out_dir)


def derive(model: torch.nn.Module, perturb_std: float, token_shift: float, seed: int) -> None:
    """Turns `model` into a related but different one: noise of `perturb_std` times each tensor's std on every
    weight, and a random `token_shift` share of the lm_head rows rotated among themselves."""
    gen = torch.Generator().manual_seed(seed)
    if perturb_std > 0:
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=gen) * param.std() * perturb_std)
    rows = int(token_shift * model.lm_head.weight.shape[0])
    if rows > 1:
        chosen = torch.randperm(model.lm_head.weight.shape[0], generator=gen)[:rows]
        model.lm_head.weight[chosen] = model.lm_head.weight[chosen.roll(1)].clone()
