"""Export a checkpoint for a serving engine.

    python -m eagle3.export outputs/.../checkpoints/best --out drafter              # speculators' format (vLLM)
    python -m eagle3.export outputs/.../checkpoints/best --format specforge --out d   # midlayer.* layout (SGLang)

The SpecForge layout renames `layers.0.*` to `midlayer.*`, leaves out embed_tokens (engines take it from
the verifier), and writes a SpecForge-style config.json whose aux layer ids count layer outputs (one less
than Hugging Face hidden_states indexing). `init=pretrained` reads either layout back exactly.

The checkpoint is checked before anything is written, as strictly as `init=pretrained` checks what it reads:
every file's safetensors header against the file's size (eagle3/init/files.py), and every tensor's name and
shape against the model its own config.json describes. A problem is one message, a non-zero exit, and
nothing at --out.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

from eagle3.init.files import CheckpointError, checkpoint_files, load_tensors, read_config, tensor_shapes
from eagle3.init.pretrained import SKIPPED
from eagle3.init.pretrained import SPECFORGE_FLAGS as SPECFORGE_DEFAULTS


def specforge_config(config: dict[str, Any], draft_vocab_size: int) -> dict[str, Any]:
    layer = config["transformer_layer_config"]
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab_size,
        "tie_word_embeddings": False,
        "eagle_config": {
            "use_aux_hidden_state": True,
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in config["eagle_aux_hidden_state_layer_ids"]],
        },
    }
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "max_position_embeddings", "rms_norm_eps", "hidden_act", "rope_theta", "rope_parameters",
                "attention_bias", "mlp_bias", "torch_dtype", "dtype"):
        if key in layer:
            out[key] = layer[key]
    for flag in SPECFORGE_DEFAULTS:  # stated, so that nobody has to guess them back
        out[flag] = bool(config.get(flag, False))
    return out


def expected_shapes(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    """The tensors, with their shapes, of the draft that `checkpoint`'s config.json describes (built by
    speculators on the meta device: no weights allocated)."""
    import torch
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

    try:
        config = Eagle3SpeculatorConfig.from_pretrained(str(checkpoint))
        config.speculators_config.verifier.name_or_path = None  # shapes only: do not look for the verifier
        with torch.device("meta"):
            model = Eagle3DraftModel(config)
    except Exception as e:  # noqa: BLE001  (pydantic and transformers raise many types for a bad config)
        raise CheckpointError(f"{checkpoint}/config.json does not describe a speculators EAGLE-3 draft "
                              f"({type(e).__name__}: {e})") from None
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_checkpoint(checkpoint: Path, shapes: dict[str, tuple[int, ...]],
                     expected: dict[str, tuple[int, ...]]) -> None:
    """Every tensor the config implies is there with its shape, and nothing else; the verifier's own tensors
    (SKIPPED: embed_tokens, its head and norm) may be left out, but not have another shape."""
    missing = [f"{k} {list(s)}" for k, s in sorted(expected.items()) if k not in shapes and k not in SKIPPED]
    unexpected = [f"{k} {list(s)}" for k, s in sorted(shapes.items()) if k not in expected]
    mismatched = [f"{k}: file {list(s)}, config.json {list(expected[k])}" for k, s in sorted(shapes.items())
                  if k in expected and s != expected[k]]
    problems = [(name, items) for name, items in (("missing", missing), ("unexpected", unexpected),
                                                  ("mismatched", mismatched)) if items]
    if problems:
        lines = [f"{name} ({len(items)}):\n    " + "\n    ".join(items) for name, items in problems]
        raise CheckpointError(f"{checkpoint}: its tensors do not fit its own config.json:\n  " + "\n  ".join(lines))


def export(checkpoint: Path, out: Path, fmt: str = "speculators") -> list[str]:
    """Writes `out` after checking the checkpoint; returns warnings for the user. Raises CheckpointError with
    nothing written when the checkpoint or `out` is unusable."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out} exists and is not an empty directory; nothing was overwritten")
    files = checkpoint_files(checkpoint)
    config = read_config(checkpoint)
    if config.get("speculators_model_type") != "eagle3":
        raise CheckpointError(f"{checkpoint}/config.json is not a speculators EAGLE-3 config")
    shapes = tensor_shapes(files)  # every header checked against its file's size: not safetensors, truncated
    check_checkpoint(checkpoint, shapes, expected_shapes(checkpoint))
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _write(checkpoint, files, config, out, fmt)
    except BaseException:
        # A failure while writing leaves no half export behind: `out` was empty or absent.
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        if created:
            out.rmdir()
        raise


def _write(checkpoint: Path, files: list[Path], config: dict[str, Any], out: Path, fmt: str) -> list[str]:
    from safetensors.torch import save_file

    if fmt == "speculators":
        index = [checkpoint / "model.safetensors.index.json"] * (len(files) > 1)
        for file in [checkpoint / "config.json", *files, *index]:
            shutil.copy2(file, out / file.name)
        return []
    tensors = load_tensors(files)
    renamed = {("midlayer." + k[len("layers.0."):] if k.startswith("layers.0.") else k): v.contiguous()
               for k, v in tensors.items() if k != "embed_tokens.weight"}
    if any(k.startswith("layers.1.") for k in renamed):
        raise CheckpointError(f"{checkpoint}: the SpecForge layout holds one decoder layer, this draft has more")
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    written = tensor_shapes([out / "model.safetensors"])  # read back: what an engine will read
    if written != {k: tuple(v.shape) for k, v in renamed.items()}:
        raise CheckpointError(f"{out / 'model.safetensors'}: reads back other tensors than were written")
    sf_config = specforge_config(config, tensors["lm_head.weight"].shape[0])
    (out / "config.json").write_text(json.dumps(sf_config, indent=2) + "\n")
    differing = {k: sf_config[k] for k, v in SPECFORGE_DEFAULTS.items() if sf_config[k] != v}
    if differing:
        return [f"this draft uses {differing}; SpecForge/SGLang drafts assume {SPECFORGE_DEFAULTS}: an engine that "
                "ignores these config keys will compute another function (serve the speculators format with vLLM)"]
    return []


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eagle3.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", type=Path, help="a checkpoint dir, e.g. <run_dir>/checkpoints/best")
    parser.add_argument("--format", choices=["speculators", "specforge"], default="speculators")
    parser.add_argument("--out", type=Path, required=True, help="an empty or new directory")
    args = parser.parse_args(argv)
    try:
        warnings = export(args.checkpoint, args.out, args.format)
    except CheckpointError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print(f"wrote {args.format} checkpoint to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
