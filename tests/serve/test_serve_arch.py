"""The draft architectures of eagle3/arch/draft.py served by vLLM on CPU: in fp32 at T=0 the engine's drafts and
accepted tokens per position equal the harness's on the same prompts at k=3 (P-EAGLE's through vLLM's parallel
drafting, all k tokens in one forward; DFlash's through vLLM's `method: dflash`, one block of k + 1 tokens).

The default architecture is served on SmolLM2 by tests/test_reference.py's learning-curve tests (the harness of
eagle3.serve is checked against eagle3.eval.accept by tests/serve/test_serve.py); here the others, one short
training each (the counts need only agree, not be good; the Qwen3 one is the reference run test_draft_arch resumes
against, trained once for both by tests/conftest.py), served by one `python -m eagle3.serve RUN RUN ...` beside one
plain server of their common verifier at k=3 (no n-gram baseline: tests/test_reference.py's learning-curve tests
serve it on SmolLM2 and check its counts). The axes of the one-forward-per-token drafts (decoder layer, depth,
EAGLE-3.1's norms) are in one draft, so that each server start (two processes importing vLLM, half a minute on 2
cores) checks all three;
tests/arch/test_draft_arch.py trains and exports each combination on its own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from commands import launch, no_server_left
from factories import SMALL_DATA

ARCHITECTURES = {
    # the three axes the non-parallel drafts differ on, in one draft: the decoder layer, the depth, EAGLE-3.1's norms
    # (factories.QWEN3_EAGLE31: the run test_draft_arch resumes against, trained once by conftest.py)
    "qwen3_two_layers_eagle31": None,
    # trained long enough that vLLM accepts some of its tokens
    "peagle": ["optim.epochs=3", "optim.lr=3e-3", "model.draft.kind=peagle"],
    "dflash": ["optim.epochs=3", "optim.lr=3e-3", "model.draft.kind=dflash"],
}
ARGS = ["--k", "3", "--num-prompts", "4", "--max-new-tokens", "24", "--no-ngram"]


@pytest.fixture(scope="module")
def served_runs(qwen3_eagle31_run, cache_dir, tmp_path_factory, engine_python) -> dict[str, Path]:  # noqa: F811
    """A run dir of each architecture, all served by one eagle3.serve command."""
    from eagle3.cli.serve import main

    runs = {}
    for name, overrides in ARCHITECTURES.items():
        if overrides is None:
            runs[name] = qwen3_eagle31_run
            continue
        runs[name] = tmp_path_factory.mktemp("arch") / name
        proc = launch([f"hydra.run.dir={runs[name]}", "logger.mode=disabled", *SMALL_DATA, *overrides], cache_dir)
        assert proc.returncode == 0, proc.stderr[-4000:]
    main([*map(str, runs.values()), *ARGS, "--python", str(engine_python)])
    return runs


@pytest.mark.slow
def test_one_plain_server_serves_beside_every_run(served_runs):
    logs = {name: sorted(p.name for p in run.glob("serve_vllm_*.log")) for name, run in served_runs.items()}
    first, *others = served_runs
    assert logs == {first: ["serve_vllm_k3_t0.log", "serve_vllm_plain_t0.log"],
                    **{name: ["serve_vllm_k3_t0.log"] for name in others}}
    for run in served_runs.values():
        no_server_left(run)


@pytest.mark.slow
@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_vllm_counts_what_the_harness_counts_per_architecture(served_runs, arch):
    report = json.loads((served_runs[arch] / "serve_vllm_k3_t0.json").read_text())
    assert report["dtype"] == "float32" and report["k"] == 3 and report["prompts"] == 4
    assert report["drafts"] == report["harness"]["drafts"] > 0
    assert report["accepted_per_position"] == report["harness"]["accepted_per_position"]
    assert report["harness"]["equal"] and report["same_tokens_as_plain"]
    assert "ngram" not in report and report["plain_tokens_per_s"] > 0
    assert report["verify_steps"] == report["drafts"]  # a drafter drafts at every verify step
    if arch == "peagle":
        assert "parallel_drafting" in (served_runs[arch] / "serve_vllm_k3_t0.log").read_text()
        assert report["accepted_per_position"][0] > 0  # something to agree on
    if arch == "dflash":
        assert '"method": "dflash"' in (served_runs[arch] / "serve_vllm_k3_t0.log").read_text()
        # The tiny DFlash drafter of this budget accepts nothing at k=3 in the engine or the harness, so the arm
        # checks that vLLM loads and serves the export with method dflash, drafts at every verify step as the harness
        # does, counts what it counts and stays lossless (above); equal counts with tokens accepted are not shown
        # (trained 10 epochs it accepted 4 tokens of one prompt, 20 epochs none: no budget to rely on, and on this
        # verifier a causal block drafts the same tokens). That vLLM runs the block as trained, non-causally, is
        # checked by test_vllm_reads_a_trained_dflash_checkpoint_as_a_non_causal_block.


@pytest.mark.slow
def test_vllm_reads_a_trained_dflash_checkpoint_as_a_non_causal_block(served_runs, engine_python):
    """vLLM's speculators reader runs every layer of a DFlash block causally unless the checkpoint states
    sliding_window_non_causal true (docs/serving.md#dflash); a checkpoint trained here states it, so vLLM runs the
    block non-causally, as it was trained and as the harness runs it."""
    code = ("import sys\n"
            "from vllm.model_executor.models.qwen3_dflash import dflash_has_any_non_causal\n"
            "from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig\n"
            "print(dflash_has_any_non_causal(SpeculatorsConfig.from_pretrained(sys.argv[1])))")
    checkpoint = served_runs["dflash"] / "checkpoints" / "best"
    proc = subprocess.run([str(engine_python), "-c", code, str(checkpoint)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-1] == "True"
