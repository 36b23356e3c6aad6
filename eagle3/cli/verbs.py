"""The verbs of `eagle3`: name -> (module under eagle3.cli, one line of help). `eagle3 --help` lists them from here
without importing a verb's module; a verb whose module is not there (yet) is not listed and not run."""

from __future__ import annotations

import importlib.util

VERBS: dict[str, tuple[str, str]] = {
    "train": ("train", "train a draft (Hydra overrides, -m for a sweep); `python launch.py` is this verb"),
    "plan": ("plan", "a run's memory and time plan, nothing built or written (train with plan=true)"),
    "prepare": ("prepare", "run a verifier over data rows and write them with its hidden states"),
    "check": ("check", "check a prepared dataset before it costs a GPU day"),
    "accept": ("accept", "measured acceptance: speculative decoding with the verifier and a trained draft"),
    "speedup": ("speedup", "the serving speedup at each k, predicted from acceptance and step costs"),
    "serve": ("serve", "serve runs with vLLM and measure them as the engine counts"),
    "export": ("export", "export a checkpoint for a serving engine (speculators' or SpecForge's layout)"),
    "compare": ("compare", "rank the runs of a sweep or study from their run dirs"),
    "forecast": ("forecast", "forecast acceptance against training tokens from a pilot run"),
    "verifier": ("verifier", "make a verifier a local Hugging Face dir (from-gguf)"),
    "reference": ("reference", "build the reference verifier and data the slow tests use"),
}


def available() -> dict[str, tuple[str, str]]:
    """The verbs whose module is there (finding a module imports none of the verb modules)."""
    return {verb: entry for verb, entry in VERBS.items()
            if importlib.util.find_spec(f"eagle3.cli.{entry[0]}") is not None}
