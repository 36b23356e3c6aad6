"""Every command the project prints runs when pasted: quoted for Hydra's override grammar, then for the shell."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys

import pytest
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser

from commands import launch
from eagle3.console import hydra_override, resume_command, shell_override
from factories import ROOT

# A sweep job's run dir (Hydra names it from the overrides) and a dir with a space and a quote.
AWKWARD_NAMES = ["1_optim.epochs=1,optim.lr=0.003", "my runs/it's [v2]"]


@pytest.mark.parametrize("value", ["/tmp/plain/run", "/tmp/x/1_optim.epochs=1,optim.lr=0.003", "/tmp/a b/c",
                                   "/tmp/it's", "/tmp/$HOME/`x`", "[1, 2]"])
def test_an_override_reads_back_as_the_same_string(value):
    parsed = OverridesParser.create().parse_override(hydra_override("resume", value))
    assert parsed.key_or_group == "resume" and parsed.value() == value
    words = subprocess.run(["bash", "-c", f"printf '%s\\n' {shell_override('resume', value)}"], capture_output=True,
                           text=True, check=True).stdout.splitlines()
    assert words == [hydra_override("resume", value)]  # one shell word, unchanged


def test_a_list_stays_a_list():
    parsed = OverridesParser.create().parse_override(hydra_override("model.draft.aux_layer_ids", [2, 16, 29]))
    assert parsed.value() == ["2", "16", "29"] or parsed.value() == [2, 16, 29]


def composed_resume(command: str) -> str:
    """What `resume` the pasted `eagle3 ...` command sets (run with --cfg job, so nothing trains), with this
    checkout's eagle3.cli as the console script."""
    assert command.startswith("eagle3 "), command
    command = command.replace("eagle3", f"{shlex.quote(sys.executable)} -m eagle3.cli", 1)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(["bash", "-c", f"{command} --cfg job"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return yaml.safe_load(proc.stdout)["resume"]


@pytest.mark.slow  # runs launch.py (--cfg job)
@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_the_printed_resume_command_runs_for_awkward_run_dirs(name, tmp_path):
    run_dir = tmp_path / name
    command = resume_command(run_dir)
    assert command.startswith("eagle3 train ")
    assert composed_resume(command) == str(run_dir)


@pytest.mark.slow  # runs launch.py
@pytest.mark.parametrize("name", AWKWARD_NAMES)
def test_the_command_in_the_refusal_to_overwrite_runs_as_printed(name, cache_dir, tmp_path):
    run_dir = tmp_path / name
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("")
    proc = launch([hydra_override("hydra.run.dir", run_dir)], cache_dir, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    # metrics.jsonl with no row past step 0: a run stopped before its first step, which resume= starts again
    command = re.search(r"start it again from step 0 with (eagle3 train .*?), or choose", proc.stderr)
    assert command, proc.stderr[-2000:]
    assert composed_resume(command.group(1)) == str(run_dir)
