"""eval.serve.enabled=true: at the end of a run, its checkpoints/best served by vLLM as `eagle3 serve RUN`
would, on eval.accept's prompts, token budget and temperature."""

from __future__ import annotations

import logging
from pathlib import Path

from eagle3.config import EvalConfig

log = logging.getLogger(__name__)


def check_engine(eval_cfg: EvalConfig) -> None:
    """With eval.serve.enabled: the engine's interpreter is there, looked for before any data is built (a run
    that trained for an hour must not find out at its end)."""
    if eval_cfg.serve.enabled:
        from eagle3.engine.venv import engine_python

        engine_python(eval_cfg.serve.python, key="eval.serve.python")


def serve_finished_run(run_dir: Path, eval_cfg: EvalConfig, seed: int) -> None:
    """Writes the run's serve_vllm_k<k>_t<T>.json reports and logs them; raises UserError (EngineError: the log
    it names) when serving fails. The servers are stopped on every way out, SIGTERM included."""
    from eagle3.engine.server import stop_on_signals
    from eagle3.serve.report import format_report
    from eagle3.serve.request import ServeRequest
    from eagle3.serve.serving import run

    accept = eval_cfg.accept
    args = ServeRequest(runs=[str(run_dir)], k=eval_cfg.serve.k, temperature=accept.temperature,
                        prompts=accept.prompts, num_prompts=accept.num_prompts, max_new_tokens=accept.max_new_tokens,
                        seed=seed, python=eval_cfg.serve.python,
                        no_ngram=True)  # the drafter alone at a run's end; eagle3 serve RUN adds the n-gram baseline
    with stop_on_signals():
        reports = run(args)
    for report in reports:
        log.info("served (eval.serve)\n%s", format_report(report))
