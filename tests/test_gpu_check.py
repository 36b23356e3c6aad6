"""bench/gpu_check.sh --dry-run on this CPU machine: its offline install, import check, GPU tier (skipped here)
and benchmark (CPU shape) really run, and its summary says what happened, so the one device call it is made for
does not fail on its own plumbing."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from factories import ROOT

PROBE = "gpu_check_probe"


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel (one package), built here without network or build backend."""
    folder.mkdir()
    info = f"{PROBE}-1.0.dist-info"
    files = {f"{PROBE}/__init__.py": b"VALUE = 42\n__version__ = '1.0'\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: 1.0\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{name},{record_hash(data)},{len(data)}\n" for name, data in files.items()) + f"{info}/RECORD,,\n"
    path = folder / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr(f"{info}/RECORD", record)
    return path


@pytest.mark.slow
def test_dry_run_installs_offline_runs_every_step_and_reports(tmp_path):
    wheel = write_wheel(tmp_path / "wheels")
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "PIP_NO_INDEX": "1"}
    env.pop("PYTHONPATH", None)  # the script puts the checkout on it itself
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--wheels", str(wheel.parent)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "gpu_check: passed" in proc.stdout
    summary = json.loads((out / "gpu_check.json").read_text())
    assert summary["dry_run"] and summary["ok"] and summary["wheels"] == [wheel.name]
    # Installed into the temporary target and imported from there; the target is gone afterwards.
    probe = summary["install"]["imports"][PROBE]
    assert summary["install"]["exit_code"] == 0 and probe["ok"] and probe["version"] == "1.0"
    assert probe["from"].startswith(str(Path(summary["install"]["target"]).resolve()))
    assert not Path(summary["install"]["target"]).exists()
    assert summary["device"]["cuda_available"] is False and summary["device"]["torch"]
    # The GPU tier ran and skipped every gpu test (no CUDA here); the benchmark ran at its CPU shape.
    tier = summary["gpu_tier"]
    assert tier["exit_code"] == 0 and tier["tests"] > 0 and tier["skipped"] == tier["tests"] and not tier["failed"]
    bench = summary["bench"]
    assert bench["exit_code"] == 0 and bench["result"]["eagle3_tokens_per_s"] > 0
    assert {p.name for p in out.iterdir()} == {"gpu_check.json", "gpu_tier.log", "gpu_tier.xml", "gpu_bench.log",
                                               "gpu_bench.json"}


def test_a_missing_wheel_folder_is_one_message(tmp_path):
    proc = subprocess.run(["bash", str(ROOT / "bench" / "gpu_check.sh"), "--dry-run", "--wheels",
                           str(tmp_path / "none")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no wheel folder" in proc.stderr and "bench/gpu_wheels.sh" in proc.stderr
