"""The trained drafter served by a real engine (vLLM): its acceptance and speedup as the engine measures them,
side by side with eagle3.eval.accept's; the export an engine reads. The engine's environment and server process are
eagle3.engine's.

metrics.py         the spec-decode counters of its /metrics
session.py         one server's measurement: the prompts one request at a time, tokens/s, counter differences
harness.py         the same prompts through eagle3.eval's harness, and the comparison of the two
serving.py         serve runs and measure them (eagle3 serve RUN [RUN ...]: eagle3/cli/serve.py); request.py what
                   one command asks, report.py one run's report at one k
after_training.py  eval.serve.enabled=true: checkpoints/best served at the end of a run
export.py          a checkpoint in speculators' or SpecForge's layout: eagle3 export
parity.py          what vLLM and SGLang read from an export, one table of rules per engine
"""
