"""The tiny default's data: random prompts continued by sampling from the verifier itself (like regenerated
responses), with their hidden states, built on first use and cached under the sampling parameters."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from eagle3.config import SynthConfig
from eagle3.data.prepare import write_dataset
from eagle3.data.sampling import sample_rows
from eagle3.formats.cache import build_once, cache_key
from eagle3.verifier.model import Verifier


def synthetic_dataset_dir(verifier_dir: Path, synth: SynthConfig, aux_layer_ids: Sequence[int],
                          cache_dir: str, dtype: str = "bfloat16") -> Path:
    """The dataset sampled from `verifier_dir` as `synth` says, built on first use and cached by its parameters."""
    params = {"verifier": str(verifier_dir), "synth": asdict(synth), "aux_layer_ids": list(aux_layer_ids),
              "dtype": dtype}
    target = Path(cache_dir) / "datasets" / f"synth-{cache_key(params)}"

    def build(tmp: Path) -> None:
        model = Verifier(verifier_dir).load()
        rows = sample_rows(model, synth)
        write_dataset(model, verifier_dir, rows, tmp, aux_layer_ids, dtype=getattr(torch, dtype),
                      batch_tokens=synth.batch_size * (synth.prompt_len + synth.response_len))

    return build_once(target, build, what="synthetic dataset")
