"""Defects from a new user's trial (issue 14): each test failed before its fix.

Items: 4 (model=auto from the verifier's config.json), 6 (experiment typos), 8 (export validates its input),
11 (rows longer than data.total_seq_len), 12 (compare's step-0 fallback, eval.accept's prompt numbering).
"""

from __future__ import annotations

import json

import pytest

from conftest import SMALL_DATA, launch, run_in_process

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
    from eagle3.sweep.compare import find_runs, table

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
    got = (cells["tau_sim@0"], cells["loss@0"], cells["best tau_sim"], cells["best step"])
    assert got == ("1.02", "73.5", "1.5", "10")
    assert cells["final tau_sim"] == cells["final loss"] == "-"  # it has no final values


def test_accept_prompt_errors_name_the_file_line(tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    from eagle3.config import ConfigError
    from eagle3.eval.measure import AcceptanceProbe
    from eagle3.eval.prompts import read_prompts_file

    verifier = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    prompts_file = tmp_path / "prompts.jsonl"
    prompts_file.write_text('{"input_ids": [1, 2, 3]}\n\n{"input_ids": [4, 99]}\n')  # line 3 is out of vocab
    with pytest.raises(ConfigError, match=r"prompts\.jsonl:3: token ids outside the verifier's vocabulary"):
        AcceptanceProbe(verifier, read_prompts_file(prompts_file, tmp_path), k=2, max_new_tokens=4)
    with pytest.raises(ConfigError, match=r"prompt 2 \(1-based\): the prompt is empty"):
        AcceptanceProbe(verifier, [[1, 2], []], k=2, max_new_tokens=4)

    from datasets import Dataset

    from eagle3.eval.prompts import val_split_prompts

    ids = [[1, 2, 3, 4]] * 10
    ids[7] = [1, 99, 3, 4]  # the val split is rows 5..9; row 7's prompt is out of vocabulary
    Dataset.from_dict({"input_ids": ids, "loss_mask": [[0, 0, 1, 1]] * 10, "seq_len": [4] * 10}).save_to_disk(
        str(tmp_path / "ds"))
    with pytest.raises(ConfigError, match=r"val row 7 of .*ds: token ids outside"):
        AcceptanceProbe(verifier, val_split_prompts(tmp_path / "ds", 0.5, 8), k=2, max_new_tokens=4)


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

    from eagle3.serve.export import main

    out = tmp_path / "out"
    assert main([str(broken_copy(small_checkpoint, tmp_path, edit)), "--format", fmt, "--out", str(out)]) != 0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and re.search(says, err), err
    assert not out.exists()


def test_export_of_a_good_checkpoint_still_works_and_an_unusable_out_is_refused(small_checkpoint, tmp_path, capsys):
    from eagle3.serve.export import main

    # speculators' flags (norm_before_residual=true): SGLang cannot serve it (tests/test_export_parity.py), vLLM can
    assert main([str(small_checkpoint), "--out", str(tmp_path / "ok")]) == 0
    assert (tmp_path / "ok" / "model.safetensors").is_file()
    (tmp_path / "file").write_text("x")
    assert main([str(small_checkpoint), "--out", str(tmp_path / "file")]) != 0
    assert "is not an empty directory" in capsys.readouterr().err and (tmp_path / "file").read_text() == "x"


# --- 4: your own verifier: model=auto reads the draft's shape from its config.json ---------------------------

def own_verifier(path):
    """A Llama verifier of another shape than the tiny default's (hidden 96, 8 layers, 6 heads / 2 KV heads,
    vocab 800), saved as a Hugging Face model dir; no draft dimension of it appears anywhere else."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=96, num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2,
                         intermediate_size=160, vocab_size=800, max_position_embeddings=256, rope_theta=50000.0,
                         rms_norm_eps=1e-5)
    LlamaForCausalLM(config).save_pretrained(str(path))
    return path


def test_model_auto_reads_the_draft_shape_from_config_json(tmp_path):
    from omegaconf import OmegaConf

    from conftest import compose_cfg

    verifier = own_verifier(tmp_path / "verifier")
    draft = OmegaConf.to_container(compose_cfg(["model=auto", f"model.verifier.path={verifier}"]).model.draft,
                                   resolve=True)
    assert {k: draft[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                  "intermediate_size", "vocab_size", "draft_vocab_size", "aux_layer_ids",
                                  "max_position_embeddings", "rope_theta", "rms_norm_eps")} == {
        "hidden_size": 96, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 160, "vocab_size": 800, "draft_vocab_size": 800, "aux_layer_ids": [2, 4, 5],
        "max_position_embeddings": 256, "rope_theta": 50000.0, "rms_norm_eps": 1e-5}
    # transformers 4's layout: rope_theta at the top, no head_dim; a large vocabulary gets a 32000-token draft one
    (tmp_path / "v4").mkdir()
    (tmp_path / "v4" / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
        "vocab_size": 128256, "num_hidden_layers": 32, "max_position_embeddings": 131072, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5}))
    for model in ("auto", "llama3_8b"):
        draft = OmegaConf.to_container(compose_cfg([f"model={model}", f"model.verifier.path={tmp_path / 'v4'}"])
                                       .model.draft, resolve=True)
        assert (draft["head_dim"], draft["draft_vocab_size"], draft["aux_layer_ids"], draft["rope_theta"]) == (
            128, 32000, [2, 16, 29], 500000.0)


@pytest.mark.parametrize("args, says", [
    (["model=auto"], "model.verifier.path is required"),
    (["model=auto", "model.verifier.path=/nonexistent"], "/nonexistent has no config.json (model=auto reads"),
    (["data=offline", "data.path={data}", "model.verifier.path=/tmp"], "for your own verifier use model=auto"),
    (["model.verifier.path=/tmp", "model.verifier.tiny=null"], "for your own verifier use model=auto"),
])
def test_own_verifier_mistakes_get_one_message(args, says, tmp_path):
    (tmp_path / "ds" / "hidden_states").mkdir(parents=True)  # data.path passes its own check: only the model is wrong
    args = [a.format(data=tmp_path / "ds") for a in args]
    proc = launch([*args, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path / "cache")
    assert proc.returncode == 1 and says in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_readme_own_data_commands_run_as_printed_on_another_verifier(tmp_path, cache_dir):
    """The README's "Preparing data": prepare, check, then the train command prepare prints, pasted as it is
    (paths with spaces included), with no draft dimension given by hand."""
    import random
    import shlex

    import yaml

    verifier = own_verifier(tmp_path / "my verifier")
    rng = random.Random(0)
    rows = []
    for _ in range(40):
        n, prompt = rng.randint(20, 60), rng.randint(2, 8)
        rows.append({"input_ids": [rng.randrange(800) for _ in range(n)],
                     "loss_mask": [0] * prompt + [1] * (n - prompt)})
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = tmp_path / "my data" / "ds"

    def run(argv):  # each command as printed, in this process
        return run_in_process(argv, cache_dir, WANDB_MODE="disabled")

    proc = run(["python", "-m", "eagle3.data.prepare", "--model", str(verifier), "--data", str(tmp_path / "rows.jsonl"),
                "--out", str(data), "--device", "cpu"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = proc.stderr.split("train on it with:\n", 1)[1].strip().splitlines()[0]
    assert printed.startswith("python launch.py model=auto ")
    proc = run(["python", "-m", "eagle3.data.check", str(data)])
    assert proc.returncode == 0 and "all good" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    proc = run(["python", "-m", "eagle3.data.check", str(data), "--quick", "--total-seq-len", "30"])  # item 11
    assert proc.returncode == 1 and "rows are longer than data.total_seq_len=30" in proc.stderr, proc.stderr[-2000:]

    run_dir = tmp_path / "run"
    # Two steps, in batches of 512 tokens (the rows are at most 60): the default's 8192 costs its attention masks
    # most of the run's time on a CPU, and nothing here depends on the batch's size.
    proc = run([*shlex.split(printed), f"hydra.run.dir={run_dir}", "optim.max_steps=2", "data.total_seq_len=512"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    resolved = yaml.safe_load((run_dir / "resolved_config.yaml").read_text())
    draft = resolved["model"]["draft"]
    assert (draft["hidden_size"], draft["num_attention_heads"], draft["num_key_value_heads"], draft["head_dim"],
            draft["vocab_size"], draft["aux_layer_ids"]) == (96, 6, 2, 16, 800, [2, 4, 5])
    assert resolved["data"]["path"] == str(data) and resolved["model"]["verifier"]["path"] == str(verifier)
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2 and (run_dir / "checkpoints" / "last" / "model.safetensors").is_file()
