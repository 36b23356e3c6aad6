"""Measured acceptance: chain speculative decoding with the Hugging Face verifier and a trained draft.

    python -m eagle3.eval.accept --run outputs/<date>/<time>                  # the run's best draft, val prompts
    python -m eagle3.eval.accept CKPT --verifier DIR --prompts p.jsonl --k 4   # any checkpoint and verifier
    python -m eagle3.eval.accept --run RUN --temperature 0.7                   # acceptance when serving at T

Prints a table and writes a JSON report (`--out`; with `--run`, `<run>/accept_k<k>.json` by default, or
`accept_k<k>_t<T>.json` at T > 0, never overwritten). At temperature 0 the speculative output is checked
against the verifier's plain greedy decoding on every run; a difference exits non-zero naming the first
prompt and position. At T > 0 it is speculative sampling (seeded), lossless in distribution.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from eagle3.eval.prompts import Prompt


# The options a training run's eval.accept also has: their defaults, help and checks are its schema's.
SCHEMA_FLAGS = {"num_prompts": "--num-prompts", "k": "--k", "max_new_tokens": "--max-new-tokens",
                "temperature": "--temperature"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from eagle3.config import AcceptEvalConfig, Device
    from eagle3.schema_cli import add_fields

    p = argparse.ArgumentParser(prog="python -m eagle3.eval.accept", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", nargs="?", help="draft checkpoint dir (speculators format); with --run: the "
                                                 "run's checkpoints/best unless given")
    p.add_argument("--verifier", help="verifier dir (local Hugging Face causal LM); with --run: the run's")
    p.add_argument("--run", help="a finished run dir: checkpoint, verifier and val-split prompts from its "
                                 "summary.json and resolved_config.yaml")
    p.add_argument("--prompts", help="{\"input_ids\": [...]} rows or conversations ({\"messages\"}, ShareGPT's "
                                     "{\"conversations\"}: up to the first assistant turn) in a JSONL file, a JSON "
                                     "array, Parquet or a datasets dir (default with --run: the prompts of the run's "
                                     "val split)")
    add_fields(p, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept", defaults={"k": None}, helps={
        "k": "draft tokens per verify step (default: the checkpoint's speculative_tokens, its training ttt_steps)"})
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling generator at temperature > 0 "
                                                       "(a training run's val passes use its seed)")
    p.add_argument("--no-cache", dest="cached", action="store_false",
                   help="recompute every forward over the whole prefix (the slower reference harness)")
    p.add_argument("--out", help="JSON report path (overwritten if it exists)")
    p.add_argument("--device", default=Device.auto.value, choices=[d.value for d in Device])
    p.add_argument("--attn-impl", default="sdpa", choices=["sdpa", "eager"], help="the draft's attention")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default on CPU: 1; many small "
                                                             "forwards gain little from more, and lose a lot "
                                                             "when the cores are shared)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from eagle3.errors import UserError
    from eagle3.eval.measure import LosslessError

    try:
        report = run(args)
    except (UserError, LosslessError) as e:
        raise SystemExit(f"error: {e}") from None
    print(format_report(report))
    print(f"report: {report['report_path']}" if report.get("report_path") else "report: not written (no --out)")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from eagle3.config import AcceptEvalConfig
    from eagle3.device.choice import resolve_runtime
    from eagle3.errors import ConfigError
    from eagle3.schema_cli import checked

    checked(args, AcceptEvalConfig, SCHEMA_FLAGS, "eval.accept", AcceptEvalConfig.check_values)
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
    from eagle3.eval.measure import AcceptanceProbe, torch_threads
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


def resolve_inputs(args: argparse.Namespace) -> tuple[Path, Path, tuple[Path, float] | None]:
    """(checkpoint, verifier dir, (data dir, train ratio) of the run's val split or None), checked to exist."""
    from eagle3.config import require_dir, run_config
    from eagle3.errors import ConfigError
    from eagle3.rundir.files import RESOLVED_CONFIG, SUMMARY, RunDir, checkpoint_dir
    from eagle3.verifier.model import Verifier

    checkpoint, verifier, val_split = args.checkpoint, args.verifier, None
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


def format_report(r: dict[str, Any]) -> str:
    """A short table: measured acceptance beside the teacher-forced estimate on the same sequences."""
    sampled = r["temperature"] > 0
    how = f"temperature {r['temperature']:g} (seed {r['seed']})" if sampled else "greedy"
    lines = [
        f"acceptance: k={r['k']}, {how}, {r['prompts']} prompts x {r['max_new_tokens']} new tokens, "
        f"{r['verify_steps']} verify steps, {r['wall_s']:.1f} s ({'KV-cached' if r['cached'] else 'uncached'})",
        f"{'accept_len':<14}{r['accept_len']:>10.4f}   measured: tokens per verify step (bonus token included)",
        f"{'tau_sim':<14}{r['tau_sim']:>10.4f}   teacher-forced on the same sequences, "
        f"ttt_steps={r['tau_sim_ttt_steps']}",
        f"{'chain_len':<14}{r['chain_len_mean']:>10.4f}   mean over positions of the chain a draft started there "
        f"would get accepted; harmonic mean {r['chain_len_harmonic']:.4f}" if r["chain_len_mean"] is not None else
        f"{'chain_len':<14}{'-':>10}   (a P-EAGLE or DFlash draft's training forward proposes no chains)",
        f"{'position':<14}{'accept_rate':>12}{'full_acc':>12}",
    ]
    for j in range(max(r["k"], r["tau_sim_ttt_steps"])):
        cells = [r["accept_rate"][j] if j < r["k"] else None, r["full_acc"][j] if j < len(r["full_acc"]) else None]
        lines.append(f"{j:<14}" + "".join(f"{c:>12.4f}" if c is not None else f"{'-':>12}" for c in cells))
    if sampled:
        lines.append(f"sampled tokens outside the draft vocabulary: {100 * r['sampled_outside_draft_vocab']:.1f}%")
        lines.append("lossless in distribution (speculative sampling; checked by the test suite, not per run)")
    else:
        lines.append(f"greedy tokens outside the draft vocabulary: {100 * r['greedy_outside_draft_vocab']:.1f}%")
        lines.append(f"lossless: the speculative output equals the verifier's greedy output for all {r['prompts']} "
                     "prompts")
    return "\n".join(lines)


if __name__ == "__main__":
    main(sys.argv[1:])
