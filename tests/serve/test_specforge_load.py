"""The SpecForge-layout export loads in SpecForge's own draft class (specforge 0.2.0's LlamaForCausalLMEagle3,
whose names SGLang's loader reads too): every tensor it has, under the name it has, with no key unexpected and none
missing but embed_tokens, which engines take from the verifier and SpecForge's own draft checkpoints leave out."""

from __future__ import annotations

import importlib
import sys

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from eagle3.engine import specforge

pytestmark = [pytest.mark.slow,  # builds SpecForge's directory on first use (network once), then reuses it
              pytest.mark.filterwarnings("ignore:flash_attn is not found")]


# Read before any test points $EAGLE3_CACHE elsewhere, so that the built directory is found and reused.
SPECFORGE_DIR = specforge.default_dir()


@pytest.fixture(scope="module")
def specforge_draft_class():
    path = str(specforge.install(SPECFORGE_DIR))
    sys.path.insert(0, path)
    try:
        yield getattr(importlib.import_module(specforge.DRAFT_MODULE), specforge.DRAFT_CLASS)
    finally:
        sys.path.remove(path)


@pytest.fixture
def tiny_default_checkpoint(tmp_path):
    """A checkpoint of the tiny default's draft (its config as launch.py composes it) with SpecForge's norm flags
    (the tiny default's norm_before_residual=true is refused for SGLang's layout), every float tensor random."""
    from eagle3.config import DraftConfig
    from eagle3.init.build import bare_draft
    from eagle3.init.pretrained import SPECFORGE_FLAGS
    from factories import compose_cfg

    draft = DraftConfig(**OmegaConf.to_container(compose_cfg().model.draft, resolve=True))
    path = tmp_path / "best"
    bare_draft(draft, SPECFORGE_FLAGS, "cpu").save_pretrained(str(path))
    file = path / "model.safetensors"
    gen = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(t.shape, generator=gen) if t.is_floating_point() else t
               for name, t in load_file(str(file)).items()}
    save_file(tensors, str(file), metadata={"format": "pt"})
    return path, tensors


def test_the_specforge_export_loads_in_specforges_own_class(specforge_draft_class, tiny_default_checkpoint,
                                                            tmp_path, capsys):
    from eagle3.cli.export import main as export_main

    checkpoint, trained = tiny_default_checkpoint
    out = tmp_path / "sglang"
    assert export_main([str(checkpoint), "--format", "specforge", "--verifier", "org/verifier",
                        "--out", str(out)]) == 0, capsys.readouterr().err
    model, info = specforge_draft_class.from_pretrained(str(out), output_loading_info=True)
    assert (info["unexpected_keys"], info["mismatched_keys"], info["error_msgs"]) == (set(), set(), [])
    assert info["missing_keys"] == {"embed_tokens.weight"}
    expected = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): t
                for k, t in trained.items() if k != "embed_tokens.weight"}
    loaded = {k: v for k, v in model.state_dict().items() if k != "embed_tokens.weight"}
    assert sorted(loaded) == sorted(expected)
    for name, tensor in expected.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    assert (model.config.draft_vocab_size, model.fc.in_features, model.config.tie_word_embeddings) == (
        expected["lm_head.weight"].shape[0], expected["fc.weight"].shape[1], False)
