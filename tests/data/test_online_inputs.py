"""data=online's inputs as a user gives them, through launch.py: every bad input is one message and a non-zero exit
before training (or a counted skip under data.on_bad_sample=skip), and every kind of token rows trains (a JSONL of
ids, a speculators-format Arrow dir with or without token_freq.pt), with the verifier sharded
across 2 ranks (DDP and FSDP), and with measured acceptance reusing the run's one verifier.

The verifier is a small Llama of its own shape (model=auto reads it from its config.json): 7 layers, hidden 64,
a 256-token vocabulary of which a word-level tokenizer with a chat template names 204, and 64 positions, so a
row of 80 tokens is longer than the verifier can take while still fitting a micro-batch. Its weights are drawn
wide (std 0.25, not 0.02), so that its next-token distributions are peaked and the draft's metrics move."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest

from commands import launch
from factories import chat_tokenizer, chat_words, read_rows, verifier_config_dir, verifier_dir

VOCAB, POSITIONS, LAYERS = 256, 64, 7
WORDS = chat_words(200)


@pytest.fixture(scope="module")
def verifier(tmp_path_factory) -> Path:
    """The verifier dir: config.json, model.safetensors, and a tokenizer with a chat template."""
    return verifier_dir(tmp_path_factory.mktemp("online_inputs") / "verifier", tokenizer=chat_tokenizer(WORDS),
                        hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                        intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=POSITIONS,
                        rope_theta=10000.0, rms_norm_eps=1e-5, initializer_range=0.25)


def id_rows(n: int, seed: int = 0) -> list[dict]:
    """`n` rows of 20 to 40 tokens, a short prompt out of the loss."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length, prompt = rng.randint(20, 40), rng.randint(2, 6)
        rows.append({"input_ids": [rng.randrange(VOCAB) for _ in range(length)],
                     "loss_mask": [0] * prompt + [1] * (length - prompt)})
    return rows


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def online(verifier: Path, run_dir: Path, *overrides: str) -> list[str]:
    return ["model=auto", f"model.verifier.path={verifier}", "data=online", f"hydra.run.dir={run_dir}",
            "logger.mode=disabled", "logger.log_every=1", "data.total_seq_len=256", "optim.max_steps=2",
            *overrides]


def assert_refused(proc, says: str, run_dir: Path) -> None:
    """One message, a non-zero exit, and nothing trained."""
    assert proc.returncode != 0 and says in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()


# --- bad rows: one message naming file:line, or a counted skip -----------------------------------------------

BAD_ROWS = {
    "not_json": ("{not json", "not a JSON object"),
    "token_out_of_vocab": ({"input_ids": [5, VOCAB + 10, 7], "loss_mask": [0, 1, 1]},
                           f"token id {VOCAB + 10} is outside the verifier's vocabulary of {VOCAB}"),
    "empty_loss_mask": ({"input_ids": [1, 2, 3], "loss_mask": [0, 0, 0]}, "no token to train on"),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(BAD_ROWS))
def test_a_bad_jsonl_row_stops_the_run_naming_its_line(kind, verifier, tmp_path):
    row, says = BAD_ROWS[kind]
    data = write_jsonl(tmp_path / "rows.jsonl", [*id_rows(5), row, *id_rows(5, seed=1)])
    proc = launch(online(verifier, tmp_path / "run", f"data.path={data}"), tmp_path / "cache")
    assert_refused(proc, f"{data}:6: {says}", tmp_path / "run")


@pytest.mark.slow
def test_a_row_longer_than_the_verifiers_positions_stops_the_run(verifier, tmp_path):
    long_row = {"input_ids": list(range(POSITIONS + 16)), "loss_mask": [1] * (POSITIONS + 16)}
    data = write_jsonl(tmp_path / "rows.jsonl", [*id_rows(8), long_row, *id_rows(8, seed=1)])
    proc = launch(online(verifier, tmp_path / "run", f"data.path={data}"), tmp_path / "cache")
    assert_refused(proc, f"80 tokens, beyond the verifier's {POSITIONS} positions", tmp_path / "run")
    assert "data.on_bad_sample=skip" in proc.stderr


def conversation(rng: random.Random) -> list[dict]:
    def words(n: int) -> str:
        return " ".join(f"w{rng.randrange(200)}" for _ in range(n))

    return [{"role": "user", "content": words(rng.randint(3, 8))},
            {"role": "assistant", "content": words(rng.randint(4, 10))},
            {"role": "user", "content": words(2)},
            {"role": "assistant", "content": words(rng.randint(4, 10))}]


@pytest.mark.slow
def test_skip_counts_bad_lines_rows_of_another_format_and_long_rows(verifier, tmp_path):
    """Under data.on_bad_sample=skip: the JSONL's bad lines are left out while reading it (among them the
    {"messages"} rows in a file whose first row is {"input_ids", "loss_mask"}: every row is in the first row's
    format), the row longer than the verifier's positions by the start-up check; both counts reach data_check.json
    and the log. Chat rows trained on their assistant turns: tests/formats/test_row_files.py and
    tests/data/test_prepare.py."""
    rng = random.Random(3)
    chats = [{"messages": conversation(rng)} for _ in range(4)]
    long_row = {"input_ids": list(range(POSITIONS + 16)), "loss_mask": [1] * (POSITIONS + 16)}
    lines = [*id_rows(6), chats[0], BAD_ROWS["not_json"][0], chats[1], long_row, BAD_ROWS["token_out_of_vocab"][0],
             *chats[2:], BAD_ROWS["empty_loss_mask"][0], *id_rows(8, seed=1)]
    data = write_jsonl(tmp_path / "rows.jsonl", lines)
    run_dir = tmp_path / "run"
    proc = launch(online(verifier, run_dir, f"data.path={data}", "data.on_bad_sample=skip"), tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((run_dir / "data_check.json").read_text())
    # Rows kept in file order: 6 id rows, the long row (index 6), 8 id rows.
    assert check["rows"] == 15 and check["counts"] == {"too_long": 1} and check["skipped_rows"] == [6]
    assert check["source_skipped"]["counts"] == {"other_format": 4, "not_json": 1, "token_out_of_vocab": 1,
                                                 "empty_loss_mask": 1}
    assert check["source_skipped"]["source"] == str(data.resolve())
    log = (run_dir / "launch.log").read_text()
    assert "7 rows skipped while reading it" in log and "1 of 15 rows are bad" in log
    assert max(r["step"] for r in read_rows(run_dir)) == 2


# --- a verifier that cannot be loaded, aux layers beyond its depth -------------------------------------------

def no_weights(model_dir: Path) -> None:
    (model_dir / "model.safetensors").unlink()


def truncated_weights(model_dir: Path) -> None:
    weights = model_dir / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def not_safetensors(model_dir: Path) -> None:
    (model_dir / "model.safetensors").write_bytes(b"\x00" * 64 + b"not weights")


def missing_tensor(model_dir: Path) -> None:
    """A whole file whose header is good, but without one of the tensors the config describes (transformers alone
    would initialize it at random and warn)."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(model_dir / "model.safetensors"))
    del tensors["model.layers.3.mlp.up_proj.weight"]
    save_file(tensors, str(model_dir / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.slow
@pytest.mark.parametrize("damage, says", [
    (no_weights, "no safetensors weights (model.safetensors or model.safetensors.index.json)"),
    (truncated_weights, "model.safetensors cannot be loaded: truncated"),
    (not_safetensors, "model.safetensors cannot be loaded: not a safetensors file"),
    (missing_tensor, "weights lack 1 of the tensors its config.json describes (model.layers.3.mlp.up_proj.weight)"),
], ids=["no_weights", "truncated", "not_safetensors", "missing_tensor"])
def test_a_verifier_that_cannot_be_loaded_stops_the_run(damage, says, verifier, tmp_path):
    broken = tmp_path / "verifier"
    shutil.copytree(verifier, broken)
    damage(broken)
    data = write_jsonl(tmp_path / "rows.jsonl", id_rows(12))
    proc = launch(online(broken, tmp_path / "run", f"data.path={data}"), tmp_path / "cache")
    assert_refused(proc, f"model.verifier.path: {broken}", tmp_path / "run")
    assert says in proc.stderr and "LOAD REPORT" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow
def test_aux_layer_ids_beyond_the_verifiers_depth_stop_the_run(verifier, tmp_path):
    data = write_jsonl(tmp_path / "rows.jsonl", id_rows(12))
    proc = launch(online(verifier, tmp_path / "run", f"data.path={data}", f"model.draft.aux_layer_ids=[1,3,{LAYERS}]"),
                  tmp_path / "cache")
    assert_refused(proc, f"[1, 3, {LAYERS}] goes beyond the verifier's {LAYERS} decoder layers", tmp_path / "run")


# --- config mistakes: one message before anything is built ----------------------------------------------------

def binary_file(tmp_path: Path) -> Path:
    (tmp_path / "rows.parquet").write_bytes(b"PAR1\x15\x04\x15\xa0\xff\xfe\x00" * 8)
    return tmp_path / "rows.parquet"


def csv_file(tmp_path: Path) -> Path:
    (tmp_path / "rows.csv").write_text("input_ids,loss_mask\n1 2 3,0 1 1\n")
    return tmp_path / "rows.csv"


def empty_file(tmp_path: Path) -> Path:
    (tmp_path / "rows.jsonl").write_text("\n")
    return tmp_path / "rows.jsonl"


def dir_without_arrow(tmp_path: Path) -> Path:
    (tmp_path / "ds" / "hidden_states").mkdir(parents=True)
    return tmp_path / "ds"


@pytest.mark.parametrize("make, says", [
    (lambda tmp: tmp / "missing.jsonl", "missing.jsonl does not exist"),
    (binary_file, "rows.parquet is not a Parquet file (no PAR1 mark at its start and end)"),
    (csv_file, "rows.csv is not a JSONL file or JSON array (its first line opens neither a JSON object nor an array: "
               "'input_ids,loss_mask')"),
    (empty_file, "rows.jsonl is empty"),
    (dir_without_arrow, "ds is a dir without Arrow rows"),
], ids=["missing", "binary", "csv", "empty", "dir_without_arrow"])
def test_a_data_path_that_holds_no_token_rows_is_one_message(make, says, tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["data=online", f"data.path={make(tmp_path)}", f"hydra.run.dir={run_dir}", "logger.mode=disabled"],
                  tmp_path / "cache")
    assert_refused(proc, says, run_dir)
    assert "data=online reads token rows" in proc.stderr and not (tmp_path / "cache").exists()


def test_measured_acceptance_with_a_sharded_verifier_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    proc = launch(["data=online", "data.shard_verifier=true", "eval.accept.enabled=true", "distributed=ddp",
                   "distributed.nproc_per_node=2", f"hydra.run.dir={run_dir}"], tmp_path / "cache")
    assert_refused(proc, "eval.accept.enabled: measures on rank 0 with the whole verifier, and "
                         "data.shard_verifier=true shards it", run_dir)


def test_a_line_that_is_not_utf8_is_a_bad_row_with_its_number(tmp_path):
    from eagle3.errors import DataError
    from eagle3.formats.row_formats import BadSamples, read_rows

    data = tmp_path / "rows.jsonl"
    data.write_bytes(b'{"input_ids": [1, 2], "loss_mask": [0, 1]}\n\xff\xfe garbage\n'
                     b'{"input_ids": [3, 4], "loss_mask": [0, 1]}\n')
    with pytest.raises(DataError, match=r"rows.jsonl:2: not UTF-8 text"):
        read_rows(data, 100, VOCAB, BadSamples("error"))
    skip = BadSamples("skip")
    assert read_rows(data, 100, VOCAB, skip) == [([1, 2], [0, 1]), ([3, 4], [0, 1])]
    assert skip.skipped == {"not_utf8": 1}


# --- a speculators-format Arrow dir; the verifier sharded across 2 ranks (DDP, FSDP) ---------------------------

@pytest.fixture(scope="module")
def arrow_rows(tmp_path_factory) -> Path:
    """Token rows as speculators' pipeline saves them (Arrow input_ids, loss_mask, seq_len, and token_freq.pt),
    without hidden states."""
    from eagle3.data.token_rows import save_rows

    out = tmp_path_factory.mktemp("online_inputs") / "arrow"
    save_rows([(r["input_ids"], r["loss_mask"]) for r in id_rows(40, seed=7)], out)
    return out


def metrics(run_dir: Path) -> dict[tuple[str, int], dict[str, float]]:
    """The loss of every logged train step, and every val pass's metrics (loss and loss_k, tau_sim, the
    accuracies)."""
    out = {}
    for row in read_rows(run_dir):
        keys = ["loss"] if row["split"] == "train" else [k for k in row if k.startswith(
            ("loss", "tau_sim", "full_acc", "cond_acc"))]
        out[(row["split"], row["step"])] = {k: row[k] for k in keys}
    return out


def assert_same_metrics(a: dict, b: dict, rel: float = 1e-5) -> None:
    assert a.keys() == b.keys() and len(a) >= 4, (a.keys(), b.keys())
    for key in a:
        assert a[key] == pytest.approx(b[key], rel=rel), (key, a[key], b[key])


TWO_RANKS = ["distributed.nproc_per_node=2", "distributed.backend=gloo"]


@pytest.mark.slow
def test_arrow_rows_train_with_and_without_token_freq_and_a_sharded_verifier_changes_no_metric(
        verifier, arrow_rows, single_run, tmp_path):
    """The verifier sharded across 2 ranks, with DDP (on a copy of the rows without token_freq.pt, which the launcher
    counts and writes next to them) and with FSDP (on the dir as given: its token_freq.pt read, not rewritten):
    the same train losses and val metrics, to 1e-5, as one process with a full verifier and the same global batch."""
    import torch

    without = tmp_path / "arrow_without_counts"
    shutil.copytree(arrow_rows, without)
    (without / "token_freq.pt").unlink()
    stamp = (arrow_rows / "token_freq.pt").stat().st_mtime_ns
    runs = {}
    for name, data in [("ddp", without), ("fsdp", arrow_rows)]:
        runs[name] = tmp_path / name
        proc = launch(online(verifier, runs[name], f"data.path={data}", f"distributed={name}", *TWO_RANKS,
                             "data.shard_verifier=true"), tmp_path / "cache")  # two ranks: processes of their own
        assert proc.returncode == 0, proc.stderr[-3000:]
        sharding = re.search(r"verifier sharded across 2 ranks .*: this rank holds (\d+) of its (\d+) decoder",
                             (runs[name] / "launch.log").read_text())
        assert sharding, name
        held, total = map(int, sharding.groups())
        assert total > 100_000 and abs(held - total / 2) < 0.01 * total  # rank 0 holds half of the verifier
    assert (arrow_rows / "token_freq.pt").stat().st_mtime_ns == stamp  # the user's counts were read as they are
    assert torch.load(without / "token_freq.pt") == torch.load(arrow_rows / "token_freq.pt")
    single_dir, _ = single_run
    reference = {key: {k: v for k, v in values.items() if not k.startswith("accept")}
                 for key, values in metrics(single_dir).items()}
    assert max(step for _, step in reference) == 2
    assert_same_metrics(metrics(runs["ddp"]), reference)
    assert_same_metrics(metrics(runs["fsdp"]), reference)


# --- measured acceptance at val passes reuses the run's verifier ----------------------------------------------

def train_in_process(overrides: list[str], run_dir: Path, cache: Path) -> None:
    """One rank in this process, as the launcher runs it (materialize the inputs, check the data, run the rank)."""
    from omegaconf import OmegaConf

    from eagle3.config import run_config
    from eagle3.run.inputs import check_data, materialize_inputs
    from eagle3.train.rank import run_rank
    from factories import compose_cfg

    plain = OmegaConf.to_container(compose_cfg([f"cache_dir={cache}", *overrides]), resolve=True, enum_to_str=True)
    plain["run"] = {"dir": str(run_dir), "name": run_dir.name, "group": run_dir.name, "choices": {}, "overrides": []}
    run_dir.mkdir(parents=True)
    cfg = run_config(plain)
    verifier_dir, data_dir = materialize_inputs(cfg)
    rows = check_data(cfg, verifier_dir, data_dir)
    run_rank(cfg, verifier_dir, data_dir, rows)


@pytest.fixture(scope="module")
def single_run(verifier, arrow_rows, tmp_path_factory) -> tuple[Path, list[Path]]:
    """One process, grad_accum=2 (the global batch of 2 ranks), with measured acceptance at every val pass; the
    dirs a verifier was loaded from during the run (Verifier.load: the one place that loads one)."""
    from eagle3.verifier.model import Verifier

    loads: list[Path] = []
    load = Verifier.load

    def counted(self, *args, **kwargs):
        loads.append(self.path)
        return load(self, *args, **kwargs)

    tmp = tmp_path_factory.mktemp("online_inputs")
    run_dir = tmp / "single"
    overrides = [o for o in online(verifier, run_dir, f"data.path={arrow_rows}") if not o.startswith("hydra.")]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Verifier, "load", counted)
        train_in_process([*overrides, "optim.grad_accum=2", "eval.accept.enabled=true", "eval.accept.num_prompts=2",
                          "eval.accept.max_new_tokens=8"], run_dir, tmp / "cache")
    return run_dir, loads


@pytest.mark.slow
def test_measured_acceptance_online_reuses_the_runs_verifier(single_run, verifier):
    run_dir, loads = single_run
    assert loads == [verifier]  # one copy: the online verifier, measured with as well
    val = [r for r in read_rows(run_dir) if r["split"] == "val"]
    assert [r["step"] for r in val] == [0, 2] and all(r["accept_len"] >= 1 for r in val)


@pytest.mark.parametrize("key,value,message", [("hidden_size", 96, "model.draft.hidden_size=64 but"),
                                               ("vocab_size", 300, "model.draft.vocab_size=256 but")])
def test_a_draft_shaped_for_another_verifier_is_refused_before_any_rank_starts(tmp_path, key, value, message):
    """Online, the verifier's config.json stands in for the offline data record: a draft whose hidden or vocabulary
    size is not the verifier's (a preset or hand-set shape, not model=auto) is one ConfigError naming the key."""
    import torch
    from safetensors.torch import save_file

    from eagle3.config import DraftConfig
    from eagle3.data.online import check_online_verifier
    from eagle3.errors import ConfigError

    config = {"model_type": "llama", "hidden_size": 64, "vocab_size": 256, "num_hidden_layers": 4,
              "max_position_embeddings": 128, key: value}
    verifier_config_dir(tmp_path, **config)
    save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
    draft = DraftConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                        head_dim=16, vocab_size=256, draft_vocab_size=128, aux_layer_ids=[0, 1, 2])
    with pytest.raises(ConfigError, match=message):
        check_online_verifier(tmp_path, draft)
    config[key] = 64 if key == "hidden_size" else 256
    verifier_config_dir(tmp_path, **config)
    assert check_online_verifier(tmp_path, draft) == 128  # the verifier's positions bound a row's length


@pytest.mark.parametrize("overrides,message", [
    (["data.shard_verifier=true"], "Key 'shard_verifier' not in 'TinyDataConfig'"),
    (["data=online", "data.path={rows}", "data.synth.num_samples=8"],
     "data.synth.num_samples: describes the rows data=online samples without a data.path"),
    (["data=online", "data.online.enabled=false"], "Could not override 'data.online.enabled'"),
], ids=["online key without data=online", "synth key with online rows", "no enabled flag"])
def test_an_online_override_that_would_change_nothing_is_one_message(tmp_path, overrides, message):
    """Neither is silently ignored: an online knob on offline data, or a sampling knob when the rows are given."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n")
    proc = launch([*[o.format(rows=rows) for o in overrides], f"hydra.run.dir={tmp_path / 'run'}"],
                  tmp_path / "cache", timeout=120)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "cache").exists()


def test_every_path_to_the_typed_config_takes_online_rows(tmp_path):
    """The sweeper checks every job with eagle3.config.validate before the first starts: data=online with a data.path
    must pass there as it does in a run (the default synth part describes no rows then, and is no override)."""
    from omegaconf import OmegaConf

    from eagle3.config import validate
    from factories import compose_cfg

    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n")
    plain = OmegaConf.to_container(compose_cfg(["data=online", f"data.path={rows}"]), resolve=True, enum_to_str=True)
    cfg = validate(plain)
    assert cfg.data.verifier_in_rank() == "full" and cfg.data.path == str(rows)


def test_a_bad_first_line_rejects_the_file_only_when_bad_rows_are_errors(tmp_path):
    from omegaconf import OmegaConf

    from eagle3.config import validate
    from eagle3.errors import ConfigError
    from factories import compose_cfg

    rows = tmp_path / "rows.jsonl"
    rows.write_text("not json\n" + json.dumps({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}) + "\n")

    def typed(*overrides: str):
        cfg = compose_cfg(["data=online", f"data.path={rows}", *overrides])
        return validate(OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))

    with pytest.raises(ConfigError, match="its first line opens neither a JSON object nor an array"):
        typed()
    typed("data.on_bad_sample=skip")  # the line is a counted skip when the rows are read


def test_a_pickled_verifier_is_refused_before_any_rank_starts(tmp_path):
    from eagle3.errors import ConfigError
    from eagle3.verifier.model import Verifier

    verifier_config_dir(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even a pickle")
    with pytest.raises(ConfigError, match="no safetensors weights .*pickle files are never loaded"):
        Verifier(tmp_path).check_weights()


def test_arrow_rows_prepared_for_another_verifier_are_refused(tmp_path):
    from eagle3.data.record import check_same_verifier, write_record
    from eagle3.errors import DataError
    from eagle3.verifier.model import Verifier

    ours, theirs, rows = tmp_path / "ours", tmp_path / "theirs", tmp_path / "rows"
    for d, vocab in ((ours, 256), (theirs, 300)):
        verifier_config_dir(d, model_type="llama", vocab_size=vocab)
    rows.mkdir()
    write_record(rows, {"verifier": Verifier(theirs).fingerprint()})
    with pytest.raises(DataError, match="were prepared for another verifier"):
        check_same_verifier(rows, ours)
    check_same_verifier(rows, theirs)


def test_a_resumed_run_refuses_rows_other_than_those_it_started_on(tmp_path):
    """An edited JSONL is other rows (another content-keyed rows dir, another draft vocabulary): resume stops."""
    from eagle3.errors import DataError
    from eagle3.run.inputs import refuse_other_rows
    from eagle3.rundir.files import DataCheck, RunDir

    RunDir(tmp_path).write_data_check(DataCheck(data_dir="/cache/datasets/rows-aaa", rows=4, bad=0, counts={},
                                                full=False, first_bad=[], policy="error", skipped_rows=[]))
    refuse_other_rows(tmp_path, Path("/cache/datasets/rows-aaa"))
    with pytest.raises(DataError, match="the data changed since the run started"):
        refuse_other_rows(tmp_path, Path("/cache/datasets/rows-bbb"))


def test_relative_paths_are_stored_absolute(tmp_path, monkeypatch):
    """resolved_config.yaml must name the same files wherever resume= is run from."""
    from eagle3.run.launch import absolute_paths

    monkeypatch.chdir(tmp_path)
    plain = {"data": {"path": "rows.jsonl"}, "model": {"verifier": {"path": "v"}}, "init": {"name": "scratch"},
             "eval": {"accept": {"prompts": None}}, "cache_dir": "cache"}
    out = absolute_paths(plain)
    assert out["data"]["path"] == str(tmp_path / "rows.jsonl")
    assert out["model"]["verifier"]["path"] == str(tmp_path / "v")
    assert out["cache_dir"] == str(tmp_path / "cache") and out["eval"]["accept"]["prompts"] is None
