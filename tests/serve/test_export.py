"""`python -m eagle3.serve.export` checks the checkpoint it reads before writing anything: a cut or foreign file,
tensors missing, unexpected or of a shape its config.json does not describe are one message and no output; a good
checkpoint exports, into an empty dir only."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A real speculators checkpoint of a small draft (speculators' own save_pretrained), untrained."""
    from eagle3.config import SPECULATORS_FLAGS, DraftConfig
    from eagle3.init.build import bare_draft

    draft = DraftConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                        num_key_value_heads=2, head_dim=16, max_position_embeddings=128, rope_theta=10000.0,
                        rms_norm_eps=1e-6, hidden_act="silu", draft_vocab_size=48, aux_layer_ids=[1, 2, 3], ttt_steps=3)
    path = tmp_path_factory.mktemp("ckpt") / "best"
    bare_draft(draft, SPECULATORS_FLAGS, "cpu").save_pretrained(str(path))
    return path


def broken_copy(checkpoint, tmp_path, edit):
    """A copy of `checkpoint` whose model.safetensors went through `edit(tensors) -> tensors`, or `edit(path)`."""
    import shutil

    from safetensors.torch import load_file, save_file

    copy = tmp_path / "broken"
    shutil.copytree(checkpoint, copy)
    file = copy / "model.safetensors"
    if edit.__code__.co_varnames[0] == "path":
        edit(file)
    else:
        save_file(edit(load_file(str(file))), str(file), metadata={"format": "pt"})
    return copy


def truncate(path):
    path.write_bytes(path.read_bytes()[:-1000])


def not_safetensors(path):
    path.write_bytes(b"PK\x03\x04 a zip, say" + bytes(5000))


def wrong_fc(tensors):
    import torch

    return tensors | {"fc.weight": torch.zeros(32, 64)}  # 2 aux layers' worth, the config says 3


def missing_key(tensors):
    return {k: v for k, v in tensors.items() if k != "layers.0.mlp.up_proj.weight"}


def unexpected_key(tensors):
    import torch

    return tensors | {"layers.1.mlp.up_proj.weight": torch.zeros(64, 32)}


@pytest.mark.parametrize("fmt", ["speculators", "specforge"])
@pytest.mark.parametrize("edit, says", [
    (truncate, "truncated"), (not_safetensors, "not a safetensors file"),
    (wrong_fc, r"mismatched \(1\):\n    fc.weight: file \[32, 64\], config.json \[32, 96\]"),
    (missing_key, r"missing \(1\):\n    layers.0.mlp.up_proj.weight \[64, 32\]"),
    (unexpected_key, r"unexpected \(1\):\n    layers.1.mlp.up_proj.weight"),
])
def test_export_refuses_a_bad_checkpoint_and_writes_nothing(small_checkpoint, tmp_path, capsys, fmt, edit, says):
    import re

    from commands import exit_status_of
    from eagle3.cli.export import main

    out = tmp_path / "out"
    assert exit_status_of(main, [str(broken_copy(small_checkpoint, tmp_path, edit)), "--format", fmt, "--out",
                                 str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(says, err), err
    assert not out.exists()


def test_export_of_a_good_checkpoint_still_works_and_an_unusable_out_is_refused(small_checkpoint, tmp_path, capsys):
    from commands import exit_status_of
    from eagle3.cli.export import main

    # speculators' flags (norm_before_residual=true): SGLang cannot serve it (tests/serve/test_export_parity.py),
    # vLLM can
    assert main([str(small_checkpoint), "--out", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    assert exit_status_of(main, [str(small_checkpoint), "--out", str(tmp_path / "file")]) == 1
    assert "is not an empty directory" in capsys.readouterr().err and (tmp_path / "file").read_text() == "x"


def test_the_old_module_path_names_the_new_one():
    """`python -m eagle3.export` (before the package's move into subpackages) printed a bare "No module named"."""
    from commands import run_in_process

    proc = run_in_process(["python", "-m", "eagle3.export", "ckpt", "--out", "drafter"])
    assert proc.returncode == 1 and proc.stderr == ("error: eagle3.export moved; the command is now: eagle3 export "
                                                    "ckpt --out drafter\n")
