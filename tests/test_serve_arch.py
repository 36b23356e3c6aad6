"""Each draft architecture of eagle3/draft_arch.py served by vLLM on CPU: in fp32 at T=0 the engine's drafts and
accepted tokens per position equal the harness's (eagle3.eval.accept) on the same prompts at k=3.

The default architecture is tests/test_serve.py's; here the others, one short training each (the counts need only
agree, not be good)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_serve import engine_python  # noqa: F401  (the session's vLLM environment)

from conftest import SMALL_DATA, launch

ARCHITECTURES = {
    "two_layers": ["model.draft.num_layers=2"],
    "qwen3_layer": ["model.draft.layer_type=qwen3"],
    "eagle31": ["model.draft.eagle31=true"],
}
ARGS = ["--num-prompts", "3", "--max-new-tokens", "20"]


@pytest.fixture(scope="module", params=list(ARCHITECTURES))
def arch_run(request, cache_dir, tmp_path_factory) -> Path:
    """A run dir of a few training steps of one architecture."""
    run_dir = tmp_path_factory.mktemp("arch") / request.param
    proc = launch([f"hydra.run.dir={run_dir}", "optim.max_steps=6", "logger.mode=disabled", *SMALL_DATA,
                   *ARCHITECTURES[request.param]], cache_dir)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return run_dir


@pytest.mark.slow
def test_vllm_counts_what_the_harness_counts_per_architecture(arch_run, engine_python, tmp_path):  # noqa: F811
    from eagle3.eval import accept
    from eagle3.serve.__main__ import main

    main([str(arch_run), "--k", "3", *ARGS, "--python", str(engine_python)])
    report = json.loads((arch_run / "serve_vllm_k3_t0.json").read_text())
    harness = accept.run(accept.parse_args(["--run", str(arch_run), "--k", "3", *ARGS,
                                            "--out", str(tmp_path / "accept_k3.json")]))
    assert report["dtype"] == "float32" and report["k"] == 3
    assert report["drafts"] == harness["verify_steps"] > 0
    assert report["accepted_per_position"] == [round(r * harness["verify_steps"]) for r in harness["accept_rate"]]
    assert report["harness"]["equal"] and report["same_tokens_as_plain"]
