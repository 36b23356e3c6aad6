"""The trained drafter served by a real engine (vLLM): its acceptance and speedup as the engine measures them,
side by side with eagle3.eval.accept's.

engine.py     the engine's own environment (vLLM pins its own torch): built once, found again
specforge.py  SpecForge's own draft class (installed without its dependencies), which loads the SGLang-layout export
server.py     vLLM's OpenAI server as a child process group: started, waited for, always stopped
metrics.py    the spec-decode counters of its /metrics
session.py    one server's measurement: the prompts one request at a time, tokens/s, counter differences
harness.py    the same prompts through eagle3.eval's harness, and the comparison of the two
__main__.py   the command line: python -m eagle3.serve RUN [RUN ...], python -m eagle3.serve --install
"""
