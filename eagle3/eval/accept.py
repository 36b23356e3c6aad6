"""Measured acceptance: chain speculative decoding with the Hugging Face verifier and a trained draft.

Its command line is `eagle3 accept` (eagle3/cli/accept.py). A measurement writes a JSON report (`--out`; with
`--run`, `<run>/accept_k<k>.json` by default, or `accept_k<k>_t<T>.json` at T > 0, never overwritten). At
temperature 0 the speculative output is checked against the verifier's plain greedy decoding on every run; a
difference exits non-zero naming the first prompt and position. At T > 0 it is speculative sampling (seeded),
lossless in distribution.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3.eval.prompts import Prompt


@dataclass
class AcceptRequest:
    """What to measure: the options of `eagle3 accept` (eagle3/cli/accept.py, whose help says what each means),
    with its defaults; num_prompts, k, max_new_tokens and temperature checked as eval.accept's."""
    checkpoint: str | None = None
    verifier: str | None = None
    run: str | None = None
    prompts: str | None = None
    num_prompts: int = 8
    k: int | None = None
    max_new_tokens: int = 32
    temperature: float = 0.0
    seed: int = 0
    cached: bool = True
    out: str | None = None
    device: str = "auto"
    attn_impl: str = "sdpa"
    threads: int | None = None


def run(args: AcceptRequest) -> dict[str, Any]:
    """Measures acceptance and writes the report (refused before measuring when it could not be written)."""
    from eagle3.device.choice import resolve_runtime
    from eagle3.errors import ConfigError

    if args.out:  # before measuring: a report that cannot be written would lose the measurement
        from eagle3.rundir.files import output_dir_problem

        given = Path(args.out)
        problem = (f"{given} is a symlink (the report is never written through one)" if given.is_symlink() else
                   f"{given} is a directory" if given.is_dir() else output_dir_problem(given.parent.absolute()))
        if problem:
            raise ConfigError(f"--out: {problem}; give the path of the JSON report to write")
    checkpoint, verifier_dir, val_split = resolve_inputs(args)
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    out = Path(args.out) if args.out else None
    k = args.k or default_k(checkpoint)
    if out is None and args.run:
        from eagle3.safe_write import refuse_links

        out = Path(args.run) / (f"accept_k{k}.json" if args.temperature == 0 else
                                f"accept_k{k}_t{args.temperature:g}.json")
        refuse_links(Path(args.run), out, "the report")  # a dangling link looks absent: refused before measuring
        if out.exists():
            raise ConfigError(f"{out} exists and is not overwritten; pass --out to write the report elsewhere")

    from eagle3.console import quiet_libraries
    from eagle3.device.threads import torch_threads
    from eagle3.eval.measure import AcceptanceProbe
    from eagle3.init.checkpoint import load_draft
    from eagle3.verifier.model import Verifier

    quiet_libraries()
    device = resolve_runtime(args.device).device_type
    prompts, source = load_prompts(args.prompts, verifier_dir, val_split, args.num_prompts)
    verifier = Verifier(verifier_dir, key="--verifier").load(device)
    try:
        draft = load_draft(checkpoint, args.attn_impl, device, verifier_dir=verifier_dir).float()
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot load the draft {checkpoint} for the verifier {verifier_dir}: {e}") from None
    probe = AcceptanceProbe(verifier, prompts, k, args.max_new_tokens, args.temperature, args.seed, args.cached)
    with torch_threads(args.threads or (1 if device == "cpu" else None)):
        measured = probe.measure(draft, progress=True)
    from eagle3.provenance import provenance

    report = {"checkpoint": str(checkpoint), "verifier": str(verifier_dir), "prompt_source": source,
              "device": device, **measured, "provenance": provenance(checkpoint)}
    if out is not None:
        write_report(out, report, Path(args.run) if args.run and not args.out else None)
        report["report_path"] = str(out)
    return report


def write_report(out: Path, report: dict[str, Any], run_dir: Path | None) -> None:
    """The report, never through a symlink: in a run dir (`run_dir`) created as a new file, never over one that
    appeared while measuring; at --out whole, replacing a file there (not a link)."""
    from eagle3.errors import ConfigError
    from eagle3.safe_write import create_file, write_text

    text = json.dumps(report, indent=2) + "\n"
    if run_dir is None:
        write_text(out.parent, out, text)
        return
    try:
        create_file(run_dir, out, text)
    except FileExistsError:
        raise ConfigError(f"{out} appeared while measuring (another eval.accept?) and is not overwritten") from None


def resolve_inputs(args: AcceptRequest) -> tuple[Path, Path, tuple[Path, float] | None]:
    """(checkpoint, verifier dir, (data dir, train ratio) of the run's val split or None), checked to exist."""
    from eagle3.config import require_dir, run_config
    from eagle3.errors import ConfigError
    from eagle3.rundir.files import RESOLVED_CONFIG, SUMMARY, RunDir, checkpoint_dir
    from eagle3.verifier.model import Verifier

    checkpoint: str | Path | None = args.checkpoint
    verifier, val_split = args.verifier, None
    if args.run:
        run = RunDir(args.run)
        if not run.file(SUMMARY).is_file() or not run.file(RESOLVED_CONFIG).is_file():
            raise ConfigError(f"--run: {run.path} is not a finished run dir (needs {SUMMARY} and {RESOLVED_CONFIG}); "
                              "pass the checkpoint dir and --verifier instead")
        summary = run.read_summary()
        train_ratio = run_config(run.read_config("--run")).data.train_ratio
        checkpoint = checkpoint or checkpoint_dir(run.path, "best")  # this run's, wherever the run dir now is
        verifier = verifier or summary.verifier_dir
        val_split = (Path(summary.data_dir), train_ratio)
    if not checkpoint or not verifier:
        raise ConfigError("give a checkpoint dir and --verifier, or --run <run dir>")
    if not args.prompts and val_split is None:
        raise ConfigError("give --prompts (a JSONL file), or --run to take the prompts of the run's val split")
    require_dir(str(checkpoint), "checkpoint", ["config.json", "model.safetensors"],
                "a draft checkpoint dir (config.json, model.safetensors)")
    require_dir(str(verifier), "verifier", [], "a local Hugging Face model dir")
    Verifier(verifier, key="--verifier").raw  # noqa: B018  (no config.json, or one that is not JSON: one message)
    return Path(checkpoint), Path(verifier), val_split


def load_prompts(prompts_file: str | None, verifier_dir: Path, val_split: tuple[Path, float] | None,
                 num_prompts: int) -> tuple[list[Prompt], str]:
    """(the first `num_prompts` prompts, where they came from): of `prompts_file`, else of the run's val split."""
    from eagle3.eval.prompts import read_prompts_file, val_split_prompts

    if prompts_file:
        return read_prompts_file(prompts_file, verifier_dir, num_prompts), str(prompts_file)
    assert val_split is not None  # resolve_inputs: --prompts, or --run for its val split
    data_dir, train_ratio = val_split
    return val_split_prompts(data_dir, train_ratio, num_prompts), f"val split of {data_dir}"


def default_k(checkpoint: Path) -> int:
    """The draft length the checkpoint was trained for (speculators saves it as speculative_tokens)."""
    from eagle3.init.files import read_config

    config = read_config(checkpoint)
    methods = config.get("speculators_config", {}).get("proposal_methods") or [{}]
    return int(methods[0].get("speculative_tokens", 3))


if __name__ == "__main__":  # the older path of `eagle3 accept` (eagle3/cli/accept.py)
    import runpy

    sys.argv[0:1] = ["eagle3", "accept"]
    runpy.run_module("eagle3.cli", run_name="__main__")
