"""The GPU benchmark runs everywhere: at a CPU-sized shape here, so it cannot rot between GPU sessions."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT


def test_gpu_benchmark_runs_at_a_cpu_shape(tmp_path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--small", "--steps", "2", "--warmup", "1",
                           "--json", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "eagle3 trainer:" in proc.stdout
    result = json.loads(out.read_text())
    assert result["eagle3_tokens_per_s"] > 0 and result["shape"]["hidden"] == 64
