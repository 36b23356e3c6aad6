"""The data check (eagle3.data.check): rows longer than data.total_seq_len are counted at start-up (a warning for a
few, an error above a share, and a run whose rows would all be cut stops), and its options are checked; rows that are
not a prepared dataset, and a preparation that did not finish, are said to be what they are."""

from __future__ import annotations

import json

import pytest

from commands import launch
from factories import SMALL_DATA


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


@pytest.mark.parametrize("value", ["0", "-5"])
def test_data_check_refuses_a_vocabulary_size_below_one(tmp_path, capsys, value):
    """--vocab-size 0 was taken as not given (the record's size was checked instead) and -5 counted every token
    as outside the vocabulary; either is refused before the dataset is read."""
    from eagle3.cli.check import main as check_main

    with pytest.raises(SystemExit) as e:
        check_main([str(tmp_path), "--vocab-size", value])
    assert e.value.code == 2 and f"--vocab-size must be >= 1, got {value}" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["jsonl", "conversations", "token_rows"])
def test_data_check_on_rows_says_they_are_rows_for_prepare_or_data_online(kind, tmp_path, capsys):
    """A datasets dir of conversations was said not to be "a dataset saved with datasets.save_to_disk"."""
    from datasets import Dataset

    from commands import exit_status_of
    from eagle3.cli.check import main

    conversation = {"conversations": [{"from": "human", "value": "w1"}, {"from": "gpt", "value": "w2"}]}
    path = tmp_path / ("rows.jsonl" if kind == "jsonl" else "rows")
    if kind == "jsonl":
        path.write_text(json.dumps(conversation) + "\n")
    else:  # token rows without seq_len are rows as a file holds them, not speculators' dataset
        rows = [conversation] if kind == "conversations" else [{"input_ids": [1, 2], "loss_mask": [0, 1]}]
        Dataset.from_list(rows).save_to_disk(str(path))
        capsys.readouterr()  # datasets' progress bar
    assert exit_status_of(main, [str(path)]) == 1
    err = capsys.readouterr().err
    what = "a rows file" if kind == "jsonl" else \
        f"a datasets dir of rows (columns {'conversations' if kind == 'conversations' else 'input_ids, loss_mask'})"
    assert err == (f"error: {path} is {what}, not a prepared dataset (Arrow rows with seq_len and their hidden "
                   f"states): prepare it with eagle3 prepare --model <verifier> --data {path} --out "
                   f"<dir> (for data=offline), or train on it as it is with data=online data.path={path}\n")


@pytest.mark.parametrize("stopped", ["before_its_rows", "among_its_hidden_states"])
def test_data_check_on_an_unfinished_preparation_says_the_same_prepare_command_resumes_it(stopped, tmp_path, capsys):
    """It listed the missing files without saying why they are missing."""
    import torch

    from commands import exit_status_of
    from eagle3.cli.check import main
    from eagle3.data.record import write_record
    from factories import write_dataset

    data = tmp_path / "my data"
    if stopped == "before_its_rows":
        data.mkdir()
    else:
        write_dataset(data, torch.float32)
        torch.save({1: 3}, data / "token_freq.pt")
        for i in range(3, 28):
            (data / "hidden_states" / f"hs_{i}.safetensors").unlink()
        capsys.readouterr()
    write_record(data, {"format": 1, "aux_layer_ids": [1, 2, 3], "hidden_size": 32, "complete": False,
                        "source": "/rows/share gpt.json"})
    assert exit_status_of(main, [str(data), "--quick"]) == 1
    out, err = capsys.readouterr()
    says = (f"{data}: its preparation did not finish (eagle3_data.json says complete: false): run the same eagle3 "
            f"prepare command again (--data '/rows/share gpt.json' --out '{data}'), it resumes where it "
            f"stopped")
    if stopped == "before_its_rows":
        assert err == f"error: {says}\n"
    else:
        assert out.startswith(f"{says}\n{data}: 25 of 28 rows are bad (quick check (no NaN/inf scan)): missing_file 25")


def test_a_loss_mask_value_other_than_0_or_1_in_a_dataset_is_a_bad_row(tmp_path):
    """Rows written by another tool (speculators' datasets read in place by data=online): -100 or 2 was trained as 1."""
    import torch
    from datasets import Dataset

    from eagle3.data.check import check_dataset

    rows = [{"input_ids": [1, 2, 3], "loss_mask": mask, "seq_len": 3} for mask in ([0, 1, 1], [0, -100, 1], [2, 0, 1])]
    Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    torch.save({1: 1, 3: 3}, tmp_path / "ds" / "token_freq.pt")
    report = check_dataset(tmp_path / "ds", hidden_states=False)
    assert report.counts() == {"bad_loss_mask": 2} and sorted(report.bad) == [1, 2]
    assert report.bad[1][1] == "loss_mask holds -100; its values are 1 (trained) and 0 (not trained)"


def test_data_check_names_the_target_layers_a_dataset_lacks(tmp_path):
    """A DFlash draft reads more verifier layers than EAGLE-3's three: eagle3 check --aux-layer-ids says which ones
    a prepared dataset lacks, before training would refuse it."""
    import json as _json

    from commands import exit_status_of
    from eagle3.cli.check import main
    from eagle3.data.check import missing_aux_layers

    (tmp_path / "eagle3_data.json").write_text(_json.dumps({"aux_layer_ids": [1, 2, 3]}))
    assert missing_aux_layers(tmp_path, [1, 2, 3]) is None
    problem = missing_aux_layers(tmp_path, [0, 1, 2, 3])
    assert problem is not None and "holds the hidden states of layers [1, 2, 3]" in problem
    assert "it lacks layers [0]; prepare it again with --aux-layer-ids 0 1 2 3, or train with data=online" in problem
    assert exit_status_of(main, [str(tmp_path), "--aux-layer-ids", "0", "1", "2", "3"]) == 1
