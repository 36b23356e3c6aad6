"""`python -m eagle3.data.prepare` and `python -m eagle3.data.check` on the tiny verifier: the right layers, chat
rows, resuming, the record of what the data holds, and every kind of bad input."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from commands import launch, run_in_process
from eagle3.errors import DataError
from eagle3.verifier.forward import batch_plan
from eagle3.verifier.model import Verifier
from eagle3.verifier.tiny import tiny_verifier_dir
from factories import CHAT_TEMPLATE, chat_tokenizer, chat_words, compose_cfg, disk_free, disk_full_after, own_verifier

AUX = [1, 2, 3]


def run_module(module: str, *args, cache_dir: Path | None = None) -> subprocess.CompletedProcess:
    return run_in_process(["python", "-m", module, *map(str, args)], cache_dir)


def prepare(verifier: Path, data: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    return run_module("eagle3.data.prepare", "--model", verifier, "--data", data, "--out", out, "--aux-layer-ids",
                      *AUX, "--batch-tokens", 256, *extra)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def verifier(cache_dir) -> Path:
    """The tiny default's verifier (vocab 1024, hidden 128, 4 layers), as `python launch.py` builds it."""
    from eagle3.config import TinyVerifierConfig

    cfg = OmegaConf.to_container(compose_cfg(), resolve=True)
    return tiny_verifier_dir(TinyVerifierConfig(**cfg["model"]["verifier"]["tiny"]), str(cache_dir))


@pytest.fixture(scope="module")
def id_rows() -> list[dict]:
    rng = random.Random(0)
    rows = []
    for _ in range(24):
        n = rng.randint(12, 60)
        prompt = rng.randint(2, 8)
        rows.append({"input_ids": [rng.randrange(1024) for _ in range(n)],
                     "loss_mask": [0] * prompt + [1] * (n - prompt)})
    return rows


@pytest.fixture(scope="module")
def prepared(verifier, id_rows, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("prepared")
    proc = prepare(verifier, write_jsonl(tmp / "rows.jsonl", id_rows), tmp / "data", "--dtype", "float32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eagle3 train model=auto" in proc.stderr  # the next command, ready to paste
    return tmp / "data"


def test_prepared_hidden_states_are_the_configured_layers(prepared, verifier, id_rows):
    model = Verifier(verifier).load()
    for i in (0, 5, 23):
        ids = id_rows[i]["input_ids"]
        saved = load_file(str(prepared / "hidden_states" / f"hs_{i}.safetensors"))
        assert saved["token_ids"].tolist() == ids
        with torch.no_grad():
            ref = model(torch.tensor([ids]), output_hidden_states=True).hidden_states
            hs = saved["hidden_states"]
            assert hs.shape == (len(ids), len(AUX) + 1, 128)
            for slot, layer in enumerate(AUX):
                torch.testing.assert_close(hs[:, slot], ref[layer][0], rtol=1e-4, atol=1e-5)
            # HF's last hidden state is after the final norm; the last slot is the one before it.
            torch.testing.assert_close(model.model.norm(hs[:, -1]), ref[-1][0], rtol=1e-4, atol=1e-5)
            assert not torch.allclose(hs[:, -1], ref[-1][0])
    record = json.loads((prepared / "eagle3_data.json").read_text())
    assert record["complete"] and record["aux_layer_ids"] == AUX and record["hidden_size"] == 128
    assert record["rows"] == 24 and record["verifier"]["num_hidden_layers"] == 4
    assert (prepared / "token_freq.pt").is_file()


def test_check_passes_a_good_dataset_and_names_bad_rows(prepared, tmp_path):
    proc = run_module("eagle3.data.check", prepared)
    assert proc.returncode == 0, proc.stderr
    assert "24 rows, all good (full check)" in proc.stdout

    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    hs = data / "hidden_states"
    (hs / "hs_3.safetensors").unlink()
    tensors = load_file(str(hs / "hs_4.safetensors"))
    tensors["hidden_states"][2, 1, 7] = float("nan")
    save_file(tensors, str(hs / "hs_4.safetensors"))
    tensors = load_file(str(hs / "hs_5.safetensors"))
    tensors["token_ids"][1] += 1
    save_file(tensors, str(hs / "hs_5.safetensors"))
    (hs / "hs_6.safetensors").write_bytes((hs / "hs_6.safetensors").read_bytes()[:1000])
    proc = run_module("eagle3.data.check", data)
    assert proc.returncode == 1
    for needle in ("4 of 24 rows are bad", "missing_file 1", "non_finite 1", "token_mismatch 1", "unreadable_file 1",
                   "row 3: hidden_states/hs_3.safetensors is missing", "row 5: hs_5.safetensors: token_ids differ "
                   "from the row's input_ids (first difference at position 1)", "truncated"):
        assert needle in proc.stdout, proc.stdout
    quick = run_module("eagle3.data.check", data, "--quick")
    assert "3 of 24 rows are bad" in quick.stdout and "non_finite" not in quick.stdout  # NaN needs the full read


def test_resuming_a_half_done_prepare_gives_identical_files(prepared, verifier, id_rows, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    record = json.loads((data / "eagle3_data.json").read_text())
    (data / "eagle3_data.json").write_text(json.dumps({**record, "complete": False}))  # as if it had been killed
    hs = data / "hidden_states"
    for i in range(0, 24, 2):
        (hs / f"hs_{i}.safetensors").unlink()
    (hs / "hs_1.safetensors").write_bytes((hs / "hs_1.safetensors").read_bytes()[:500])  # cut mid-write
    kept = {i: (hs / f"hs_{i}.safetensors").stat().st_mtime_ns for i in range(3, 24, 2)}
    proc = prepare(verifier, write_jsonl(tmp_path / "rows.jsonl", id_rows), data, "--dtype", "float32")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for i in range(24):
        name = f"hs_{i}.safetensors"
        assert (hs / name).read_bytes() == (prepared / "hidden_states" / name).read_bytes(), name
    assert {i: (hs / f"hs_{i}.safetensors").stat().st_mtime_ns for i in kept} == kept  # valid files not rewritten
    assert json.loads((data / "eagle3_data.json").read_text())["hidden_state_files_written"] == 13
    assert not list(hs.glob(".*tmp"))


def test_prepare_refuses_to_overwrite_another_dataset(prepared, verifier, id_rows, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in (data / "hidden_states").iterdir())
    proc = prepare(verifier, write_jsonl(tmp_path / "rows.jsonl", id_rows[:10]), data, "--dtype", "float32")
    assert proc.returncode == 1 and "holds another preparation (its rows, rows_sha256 differ" in proc.stderr
    assert "Traceback" not in proc.stderr
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    proc = prepare(verifier, tmp_path / "rows.jsonl", foreign)
    assert proc.returncode == 1 and "is not empty and was not written by" in proc.stderr
    assert sorted((p.name, p.stat().st_mtime_ns) for p in (data / "hidden_states").iterdir()) == before
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


@pytest.mark.slow
def test_chat_messages_train_on_the_assistant_turns(verifier, tmp_path):
    words = chat_words(50)
    fast = chat_tokenizer(words, chat_template=None)
    chat_model = tmp_path / "verifier"
    shutil.copytree(verifier, chat_model)

    plain = write_jsonl(tmp_path / "chat.jsonl", [{"messages": [{"role": "user", "content": "w1"},
                                                                {"role": "assistant", "content": "w2"}]}])
    fast.save_pretrained(chat_model)  # a tokenizer, but no chat template yet
    proc = prepare(chat_model, plain, tmp_path / "none")
    assert proc.returncode == 1 and "has no chat template" in proc.stderr and "Traceback" not in proc.stderr

    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(chat_model)
    conversation = [{"role": "user", "content": "w1 w2 w3"}, {"role": "assistant", "content": "w4 w5"},
                    {"role": "user", "content": "w6"}, {"role": "assistant", "content": "w7 w8 w9"}]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": conversation}, {"messages": conversation[:2]}])
    proc = prepare(chat_model, data, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    from datasets import load_from_disk

    rows = load_from_disk(str(tmp_path / "out"))
    ids, mask = rows[0]["input_ids"].tolist(), rows[0]["loss_mask"].tolist()
    assert [words[t] for t in ids] == ["<|user|>", "w1", "w2", "w3", "<|end|>", "<|assistant|>", "w4", "w5", "<|end|>",
                                       "<|user|>", "w6", "<|end|>", "<|assistant|>", "w7", "w8", "w9", "<|end|>"]
    assert [words[t] for t, m in zip(ids, mask) if m] == ["w4", "w5", "<|end|>", "w7", "w8", "w9", "<|end|>"]
    assert rows[1]["loss_mask"].tolist() == [0] * 6 + [1] * 3
    record = json.loads((tmp_path / "out" / "eagle3_data.json").read_text())
    assert record["row_format"] == "messages" and record["row_format_from"] == f"detected from the first row ({data}:1)"
    proc = prepare(chat_model, data, tmp_path / "sharegpt", "--format", "sharegpt")
    assert proc.returncode == 1 and f"{data}:1: a messages row among sharegpt rows (the format was set" in proc.stderr
    proc = prepare(chat_model, data, tmp_path / "head", "--max-records", "1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(load_from_disk(str(tmp_path / "head"))) == 1
    assert json.loads((tmp_path / "head" / "eagle3_data.json").read_text())["max_records"] == 1
    proc = prepare(chat_model, data, tmp_path / "none", "--max-records", "0")
    assert proc.returncode == 1 and proc.stderr.strip() == "error: --max-records must be at least 1, got 0"


@pytest.mark.slow
def test_bad_rows_are_an_error_or_a_counted_skip(verifier, id_rows, tmp_path):
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    proc = prepare(verifier, empty, tmp_path / "e")
    assert proc.returncode == 1 and "holds no usable rows" in proc.stderr and not (tmp_path / "e").exists()

    good = id_rows[:4]
    bad = [{"input_ids": [5, 2000, 7], "loss_mask": [0, 1, 1]},            # line 5: out of the vocabulary
           "{not json",                                                    # line 6
           {"input_ids": [1, 2, 3], "loss_mask": [0, 1]},                  # line 7: lengths differ
           {"input_ids": [1, 2, 3], "loss_mask": [0, 0, 0]},               # line 8: nothing to train on
           {"input_ids": list(range(100)), "loss_mask": [0] * 10 + [1] * 90}]  # line 9: truncated to 64
    data = write_jsonl(tmp_path / "mixed.jsonl", good + bad)
    proc = prepare(verifier, data, tmp_path / "err", "--max-len", 64)
    assert proc.returncode == 1 and "mixed.jsonl:5: token id 2000 is outside the verifier's vocabulary" in proc.stderr
    assert not (tmp_path / "err").exists()
    proc = prepare(verifier, data, tmp_path / "skip", "--max-len", 64, "--on-bad-sample", "skip")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "skip" / "eagle3_data.json").read_text())
    assert record["rows"] == 5 and record["truncated"] == 1
    assert record["skipped"] == {"token_out_of_vocab": 1, "not_json": 1, "malformed": 1, "empty_loss_mask": 1}
    assert len(load_file(str(tmp_path / "skip" / "hidden_states" / "hs_4.safetensors"))["token_ids"]) == 64


def test_batch_plan_depends_only_on_lengths():
    plan = batch_plan([5, 9, 3, 9, 1], batch_tokens=20)
    assert plan == [[1, 3], [0, 2, 4]]
    assert sorted(i for b in plan for i in b) == list(range(5))
    assert batch_plan([50, 2], batch_tokens=10) == [[0], [1]]  # a row longer than a batch still gets one


def train_on(data: Path, cache_dir: Path, tmp_path: Path, *overrides) -> tuple[subprocess.CompletedProcess, Path]:

    run_dir = tmp_path / "run"
    # data=offline packs 8192 tokens a batch: this data's 24 rows in one padded batch that takes a minute a step.
    proc = launch([f"hydra.run.dir={run_dir}", "data=offline", f"data.path={data}", "data.total_seq_len=512",
                   "logger.mode=disabled", *overrides], cache_dir)
    return proc, run_dir


@pytest.mark.slow
def test_trainer_refuses_data_from_other_layers_or_another_verifier(prepared, cache_dir, tmp_path):
    proc, run_dir = train_on(prepared, cache_dir, tmp_path, "model.draft.aux_layer_ids=[0,1,2]", "optim.max_steps=0")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "model.draft.aux_layer_ids=[0, 1, 2] but" in proc.stderr
    assert "holds the hidden states of layers [1, 2, 3]" in proc.stderr
    assert not (run_dir / "checkpoints").exists()
    proc, _ = train_on(prepared, cache_dir, tmp_path / "v", "model.verifier.tiny.init_std=0.03", "optim.max_steps=0")
    assert proc.returncode == 1 and "the data's hidden states come from another verifier" in proc.stderr


@pytest.mark.slow
def test_trainer_stops_on_bad_rows_or_skips_and_counts_them(prepared, cache_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    (data / "hidden_states" / "hs_3.safetensors").unlink()
    tensors = load_file(str(data / "hidden_states" / "hs_5.safetensors"))
    tensors["token_ids"][0] += 1
    save_file(tensors, str(data / "hidden_states" / "hs_5.safetensors"))

    proc, run_dir = train_on(data, cache_dir, tmp_path / "error", "optim.max_steps=2")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "2 of 24 rows are bad" in proc.stderr and "data.on_bad_sample=skip" in proc.stderr
    assert not (run_dir / "checkpoints").exists()

    proc, run_dir = train_on(data, cache_dir, tmp_path / "skip", "optim.max_steps=2", "data.on_bad_sample=skip")
    assert proc.returncode == 0, proc.stderr[-3000:]
    check = json.loads((run_dir / "data_check.json").read_text())
    assert check["skipped_rows"] == [3, 5] and check["counts"] == {"missing_file": 1, "token_mismatch": 1}
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2
    # The draft vocabulary was cached next to the data under speculators' names.
    assert (data / "d2t-512.npy").is_file() and (data / "t2d-512.npy").is_file()


@pytest.mark.slow
def test_data_without_a_record_is_accepted_with_a_warning(prepared, cache_dir, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared, data)
    (data / "eagle3_data.json").unlink()  # as speculators' own pipeline writes it
    proc, run_dir = train_on(data, cache_dir, tmp_path, "optim.max_steps=0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "has no eagle3_data.json" in proc.stdout + proc.stderr
    stamp = (data / "d2t-512.npy").stat().st_mtime_ns
    proc, _ = train_on(data, cache_dir, tmp_path / "again", "optim.max_steps=0")
    assert proc.returncode == 0 and (data / "d2t-512.npy").stat().st_mtime_ns == stamp  # reused, not rebuilt


@pytest.mark.slow
def test_check_flags_out_of_vocabulary_ids_and_empty_loss_masks(verifier, tmp_path):
    from eagle3.data.check import check_dataset
    from eagle3.data.prepare import write_dataset

    rows = [([1, 2, 3, 4], [0, 1, 1, 1]), ([5, 6, 7], [0, 0, 0]), ([8, 900, 9], [0, 1, 1])]
    write_dataset(Verifier(verifier).load(), verifier, rows, tmp_path / "d", AUX, dtype=torch.float32)
    report = check_dataset(tmp_path / "d", vocab_size=512)
    assert report.good_rows == [0]
    assert report.bad[1][0] == "empty_loss_mask"
    assert report.bad[2] == ("token_out_of_vocab", "token id 900 is outside the vocabulary of 512")


@pytest.mark.parametrize("live", [False, True], ids=["dangling", "live"])
@pytest.mark.parametrize("name", ["eagle3_data.json", "dataset_info.json", "state.json", "token_freq.pt",
                                  "data-00000-of-00001.arrow", "hidden_states", "hidden_states/hs_0.safetensors"])
def test_a_dataset_dir_holding_a_symlink_is_refused_before_the_verifier_loads(name, live, tmp_path):
    out, outside = tmp_path / "data", tmp_path / "outside"
    outside.mkdir()
    target = outside / Path(name).name
    if live:
        target.write_text("keep")
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    (out / name).symlink_to(target)
    proc = prepare(tmp_path / "verifier", tmp_path / "rows.jsonl", out)  # refused before either is read
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"{out / name} is a symlink" in proc.stderr and "nothing was written" in proc.stderr
    assert [p.read_text() for p in outside.iterdir()] == (["keep"] if live else [])


def test_a_cache_entry_is_never_built_through_a_symlink(tmp_path):
    """A dangling link at an entry's name is refused (a live one to a built dir is read, as a built entry); a link
    at the name of its temporary dir is removed itself, never built into."""
    import os

    from eagle3.errors import UserError
    from eagle3.formats.cache import build_once

    def build(tmp: Path) -> None:
        (tmp / "rows").write_text("built")

    outside = tmp_path / "outside"
    outside.mkdir()
    entry = tmp_path / "cache" / "datasets" / "rows-1"
    entry.parent.mkdir(parents=True)
    entry.symlink_to(outside / "gone")
    with pytest.raises(UserError, match="rows-1 is a symlink"):
        build_once(entry, build, "token rows")
    entry.unlink()
    (entry.parent / f"rows-1.tmp-{os.getpid()}").symlink_to(outside, target_is_directory=True)
    assert build_once(entry, build, "token rows") == entry and (entry / "rows").read_text() == "built"
    assert list(outside.iterdir()) == []


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
    assert printed.startswith("eagle3 train model=auto ")
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


def prepare_main(verifier_dir: Path, data: Path, out: Path) -> int:
    from commands import exit_status_of
    from eagle3.cli.prepare import main

    return exit_status_of(main, ["--model", str(verifier_dir), "--data", str(data), "--out", str(out),
                                 "--aux-layer-ids", *map(str, AUX), "--batch-tokens", "256"])


def test_prepare_on_a_full_disk_keeps_whole_files_and_resumes(verifier, id_rows, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, out = write_jsonl(tmp_path / "rows.jsonl", id_rows), tmp_path / "ds"
    with monkeypatch.context() as patch:
        disk_full_after(3, patch)
        assert prepare_main(verifier, data, out) == 1
    err = capsys.readouterr().err
    assert "error: no space left on the disk of" in err and "resumes" in err and "Traceback" not in err, err
    hidden = [p.name for p in (out / "hidden_states").iterdir()]
    assert len(hidden) == 3 and all(n.startswith("hs_") for n in hidden), hidden  # no half file beside them
    assert prepare_main(verifier, data, out) == 0
    assert len(list((out / "hidden_states").glob("hs_*.safetensors"))) == len(id_rows)


def test_prepare_is_refused_when_the_disk_cannot_hold_it(verifier, id_rows, tmp_path, monkeypatch, capsys):  # noqa: F811
    data, out = write_jsonl(tmp_path / "rows.jsonl", id_rows), tmp_path / "ds"
    disk_free(4096, monkeypatch)
    assert prepare_main(verifier, data, out) == 1
    assert "GiB free, but the hidden states of these rows need" in capsys.readouterr().err
    assert not out.exists()


def test_prepare_removes_half_written_rows_on_a_full_disk(verifier, id_rows, tmp_path, monkeypatch, capsys):  # noqa: F811
    import errno

    import eagle3.data.prepare as prepare

    def save_rows(rows, out_dir):  # the Arrow file is cut short when the disk fills up
        (out_dir / "data-00000-of-00001.arrow").write_bytes(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    data, out = write_jsonl(tmp_path / "rows.jsonl", id_rows), tmp_path / "ds"
    monkeypatch.setattr(prepare, "save_rows", save_rows)
    assert prepare_main(verifier, data, out) == 1
    assert "error: no space left on the disk of" in capsys.readouterr().err
    assert not list(out.glob("*.arrow"))


def test_prepare_refuses_aux_layer_ids_that_name_a_layer_twice(cache_dir, tmp_path, capsys):
    """A dataset of layers [2, 2] would cost the whole verifier pass and no run could train on it (a run refuses
    model.draft.aux_layer_ids=[2,2]); refused before a file is written."""
    from commands import exit_status_of
    from eagle3.cli.prepare import main as prepare_main
    from eagle3.config import TinyVerifierConfig
    from eagle3.verifier.tiny import tiny_verifier_dir

    plain = OmegaConf.to_container(compose_cfg(), resolve=True)
    verifier = tiny_verifier_dir(TinyVerifierConfig(**plain["model"]["verifier"]["tiny"]), str(cache_dir))
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"input_ids": [1, 2, 3, 4], "loss_mask": [0, 1, 1, 1]}) + "\n")
    out = tmp_path / "out"
    assert exit_status_of(prepare_main, ["--model", str(verifier), "--data", str(data), "--out", str(out),
                         "--aux-layer-ids", "2", "2", "--device", "cpu"]) == 1
    assert "error: aux layer ids [2, 2] name a layer twice" in capsys.readouterr().err
    assert not out.exists()


def test_a_prepare_data_path_that_is_no_file_says_what_it_is(tmp_path):
    """--data <a directory> was said not to exist; a directory is now read as a datasets dir."""
    from eagle3.formats.row_formats import BadSamples, read_rows

    with pytest.raises(DataError, match=rf"^{tmp_path} is not a dataset saved with datasets.save_to_disk"):
        read_rows(tmp_path, 64, 1024, BadSamples("error"))
    with pytest.raises(DataError, match=r"missing.jsonl does not exist; expected a JSONL file"):
        read_rows(tmp_path / "missing.jsonl", 64, 1024, BadSamples("error"))


def test_prepare_refuses_a_max_records_beyond_any_count_before_anything_is_written(tmp_path, capsys):
    """--max-records 99999999999999999999999 passed its check and died in itertools.islice with a traceback."""
    from commands import exit_status_of
    from eagle3.cli.prepare import main as prepare_main

    data = write_jsonl(tmp_path / "rows.jsonl", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}])
    out = tmp_path / "out"
    assert exit_status_of(prepare_main, ["--model", str(tmp_path / "no-model"), "--data", str(data), "--out", str(out),
                         "--max-records", "99999999999999999999999"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --max-records 99999999999999999999999 is more records than any file holds (at "
                          "most 9223372036854775807); leave it out to read every record"), err
    assert err.count("error:") == 1 and not out.exists()


def test_prepares_bad_row_messages_name_its_own_flags_not_a_runs_keys(verifier, tmp_path, capsys):
    """Raised under prepare, "data.format" and "on_bad_sample=skip" name options prepare does not have."""
    from commands import exit_status_of
    from eagle3.cli.prepare import main as prepare_main

    data = write_jsonl(tmp_path / "rows.jsonl", [{"conversations": [{"from": "human", "value": "w1"}]}])
    assert exit_status_of(prepare_main, ["--model", str(verifier), "--data", str(data), "--out", str(tmp_path / "out"),
                         "--aux-layer-ids", *map(str, AUX), "--format", "messages"]) == 1
    err = capsys.readouterr().err
    assert "a sharegpt row among messages rows (the format was set by --format) (--on-bad-sample skip leaves such " \
           "rows out and counts them)" in err, err
    assert "data.format" not in err and "on_bad_sample" not in err
