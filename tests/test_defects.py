"""Defects from a new user's trial (issue 14): each test failed before its fix.

Items: 4 (model=auto from the verifier's config.json), 6 (experiment typos), 8 (export validates its input),
11 (rows longer than data.total_seq_len), 12 (compare's step-0 fallback, eval.accept's prompt numbering).
"""

from __future__ import annotations

import json

import pytest

from conftest import SMALL_DATA, launch


# --- 6: an experiment name that does not exist is an error, listing the ones that do ---------------------

@pytest.mark.parametrize("extra", [[], ["--cfg", "job"]])
def test_unknown_experiment_is_refused_with_the_list(extra, tmp_path):
    proc = launch(["experiment=kimi_k25_scrach", f"hydra.run.dir={tmp_path / 'run'}", *extra], tmp_path / "cache")
    assert proc.returncode != 0
    assert "experiment/kimi_k25_scrach" in proc.stderr
    assert "kimi_k25_scratch" in proc.stderr and "kimi_k25_finetune_k2" in proc.stderr  # the ones that exist
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing trained


# --- 12: compare reads step-0/best from metrics.jsonl without summary.json; eval.accept names file lines ----

def test_compare_shows_step0_and_best_of_an_incomplete_run(tmp_path):
    from eagle3.compare import find_runs, table

    run = tmp_path / "0_optim.lr=0.001"
    run.mkdir()
    (run / "resolved_config.yaml").write_text("optim:\n  lr: 0.001\n")
    rows = [{"step": 0, "split": "val", "loss": 73.5, "tau_sim": 1.02},
            {"step": 5, "split": "train", "loss": 40.0},
            {"step": 10, "split": "val", "loss": 30.25, "tau_sim": 1.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    header, body = table(find_runs([tmp_path]))  # no summary.json: killed before it finished
    cells = dict(zip(header, body[0]))
    assert cells["status"] == "incomplete"
    assert (cells["tau_sim@0"], cells["loss@0"], cells["best tau_sim"], cells["best step"]) == ("1.02", "73.5", "1.5", "10")
    assert cells["final tau_sim"] == cells["final loss"] == "-"  # it has no final values


def test_accept_prompt_errors_name_the_file_line(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3.config import ConfigError
    from eagle3.eval.measure import AcceptanceProbe
    from eagle3.eval.prompts import read_jsonl_prompts

    verifier = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text('{"input_ids": [1, 2, 3]}\n\n{"input_ids": [4, 99]}\n')  # line 3 is out of vocab
    with pytest.raises(ConfigError, match=r"prompts\.jsonl line 3: token ids outside the verifier's vocabulary"):
        AcceptanceProbe(verifier, read_jsonl_prompts(prompts_file, tmp_path), k=2, max_new_tokens=4)
    with pytest.raises(ConfigError, match=r"prompt 2 \(1-based\): the prompt is empty"):
        AcceptanceProbe(verifier, [[1, 2], []], k=2, max_new_tokens=4)


# --- 11: rows longer than data.total_seq_len are counted at start-up: a warning, an error above a share ------

def test_truncation_count_warns_for_a_few_rows_and_stops_above_the_share():
    import numpy as np

    from eagle3.config import ConfigError
    from eagle3.data.check import TRUNCATION_ERROR_SHARE, CheckReport, count_truncated

    lens = np.array([64] * 95 + [100] * 5)  # 5% of the rows are longer than 64 + 1 positions
    report = CheckReport("ds", len(lens), truncation=count_truncated(lens, 64))
    assert report.as_dict()["truncated"] == {"total_seq_len": 64, "rows": 5, "tokens_lost": 5 * 35, "longest_row": 100}
    assert "5 of 100 rows are longer than data.total_seq_len=64" in report.truncation_warning()
    assert CheckReport("ds", 95, truncation=count_truncated(lens[:95], 64)).truncation_warning() is None  # 64 fits 63
    lens = np.array([64] * 80 + [100] * 20)
    assert 20 > TRUNCATION_ERROR_SHARE * 100
    with pytest.raises(ConfigError, match=r"20 of 100 rows .* data.total_seq_len=99 or more"):
        CheckReport("ds", 100, truncation=count_truncated(lens, 64)).truncation_warning()


@pytest.mark.slow
def test_a_total_seq_len_shorter_than_every_row_stops_the_run(tmp_path, cache_dir):
    run_dir = tmp_path / "run"
    # SMALL_DATA's rows are 16 + 48 = 64 tokens; 40 per micro-batch would cut every one of them.
    proc = launch([f"hydra.run.dir={run_dir}", *SMALL_DATA[:-1], "data.total_seq_len=40", "optim.max_steps=0"],
                  cache_dir, WANDB_MODE="disabled")
    assert proc.returncode != 0
    assert "128 of 128 rows are longer than data.total_seq_len=40" in proc.stderr
    assert "Traceback" not in proc.stderr
    check = json.loads((run_dir / "data_check.json").read_text())
    assert check["truncated"] == {"total_seq_len": 40, "rows": 128, "tokens_lost": 128 * 23, "longest_row": 64}
    assert not (run_dir / "metrics.jsonl").exists()


# --- 8: export checks the checkpoint it reads (headers, keys, shapes against its config.json) ----------------

@pytest.fixture(scope="module")
def small_checkpoint(tmp_path_factory):
    """A real speculators checkpoint of a small draft (speculators' own save_pretrained), untrained."""
    from eagle3.init.build import SPECULATORS_FLAGS, bare_draft

    draft = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=2,
                 head_dim=16, max_position_embeddings=128, rope_theta=10000.0, rms_norm_eps=1e-6, hidden_act="silu",
                 draft_vocab_size=48, aux_layer_ids=[1, 2, 3], ttt_steps=3)
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

    from eagle3.export import main

    out = tmp_path / "out"
    assert main([str(broken_copy(small_checkpoint, tmp_path, edit)), "--format", fmt, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(says, err), err
    assert not out.exists()


def test_export_of_a_good_checkpoint_still_works_and_an_unusable_out_is_refused(small_checkpoint, tmp_path, capsys):
    from eagle3.export import main

    assert main([str(small_checkpoint), "--format", "specforge", "--out", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    assert main([str(small_checkpoint), "--out", str(tmp_path / "file")]) != 0
    assert "is not an empty directory" in capsys.readouterr().err and (tmp_path / "file").read_text() == "x"
