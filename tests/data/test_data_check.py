"""The data check (eagle3.data.check): rows longer than data.total_seq_len are counted at start-up (a warning for a
few, an error above a share, and a run whose rows would all be cut stops), and its options are checked."""

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
    from eagle3.data.check import main as check_main

    with pytest.raises(SystemExit) as e:
        check_main([str(tmp_path), "--vocab-size", value])
    assert e.value.code == 2 and f"--vocab-size must be >= 1, got {value}" in capsys.readouterr().err


def test_data_check_names_the_target_layers_a_dataset_lacks(tmp_path):
    """A DFlash draft reads more verifier layers than EAGLE-3's three: data.check --aux-layer-ids says which ones
    a prepared dataset lacks, before training would refuse it."""
    import json as _json

    from eagle3.data.check import main, missing_aux_layers

    (tmp_path / "eagle3_data.json").write_text(_json.dumps({"aux_layer_ids": [1, 2, 3]}))
    assert missing_aux_layers(tmp_path, [1, 2, 3]) is None
    problem = missing_aux_layers(tmp_path, [0, 1, 2, 3])
    assert problem is not None and "holds the hidden states of layers [1, 2, 3]" in problem
    assert "it lacks layers [0]; prepare it again with --aux-layer-ids 0 1 2 3, or train with data=online" in problem
    assert main([str(tmp_path), "--aux-layer-ids", "0", "1", "2", "3"]) == 1
