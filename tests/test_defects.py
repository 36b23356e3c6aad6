"""Defects from a new user's trial (issue 14): each test failed before its fix.

Items: 4 (model=auto from the verifier's config.json), 6 (experiment typos), 8 (export validates its input),
11 (rows longer than data.total_seq_len), 12 (compare's step-0 fallback, eval.accept's prompt numbering).
"""

from __future__ import annotations

import pytest

from tests.conftest import launch


# --- 6: an experiment name that does not exist is an error, listing the ones that do ---------------------

@pytest.mark.parametrize("extra", [[], ["--cfg", "job"]])
def test_unknown_experiment_is_refused_with_the_list(extra, tmp_path):
    proc = launch(["experiment=kimi_k25_scrach", f"hydra.run.dir={tmp_path / 'run'}", *extra], tmp_path / "cache")
    assert proc.returncode != 0
    assert "experiment/kimi_k25_scrach" in proc.stderr
    assert "kimi_k25_scratch" in proc.stderr and "kimi_k25_finetune_k2" in proc.stderr  # the ones that exist
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # nothing trained
