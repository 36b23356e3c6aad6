"""The trained drafter served by a real engine (vLLM): its acceptance and speedup as the engine measures them,
side by side with eagle3.eval.accept's; the export an engine reads. The engine's environment and server process are
eagle3.engine's.

metrics.py         the spec-decode counters of its /metrics
session.py         one server's measurement: the prompts one request at a time, tokens/s, counter differences
harness.py         the same prompts through eagle3.eval's harness, and the comparison of the two
__main__.py        the command line: python -m eagle3.serve RUN [RUN ...], python -m eagle3.serve --install
after_training.py  eval.serve.enabled=true: checkpoints/best served at the end of a run
export.py          a checkpoint in speculators' or SpecForge's layout: python -m eagle3.serve.export
parity.py          what vLLM and SGLang read from an export, one table of rules per engine
"""
