"""Export a checkpoint for a serving engine.

    eagle3 export outputs/.../checkpoints/best --out drafter              # speculators' format (vLLM)
    eagle3 export outputs/.../checkpoints/best --format specforge --out d   # midlayer.* layout (SGLang)
    ... --verifier meta-llama/Llama-3.1-8B-Instruct   # the verifier `vllm serve <drafter>` loads

The SpecForge layout renames `layers.0.*` to `midlayer.*`, leaves out embed_tokens (engines take it from
the verifier), and writes a SpecForge-style config.json whose aux layer ids are written as SGLang reads them
(nested eagle_config, offset by the target's rule: one less than Hugging Face hidden_states indexing for
Llama/Qwen targets). `init=pretrained` reads either layout back exactly. Both formats state what an engine
would otherwise guess: the norm flags, untied embeddings, and the draft's RoPE in every schema engines read.

The checkpoint is checked before anything is written, as strictly as `init=pretrained` checks what it reads:
every file's safetensors header against the file's size (eagle3/init/files.py), every tensor's name and
shape against the model its own config.json describes, and what the format's engine will read against how the
draft was trained (eagle3/serve/parity.py: vLLM's rules for the speculators format, SGLang's for the SpecForge
layout). A problem is one message, a non-zero exit, and nothing at --out; a rule that only warns is printed.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from eagle3.arch.draft import DFLASH_NON_CAUSAL, has_sliding_layers
from eagle3.arch.rope import Rope, RopeError, engine_keys, read_rope
from eagle3.errors import UserError
from eagle3.formats.tensorfile import INDEX
from eagle3.init.files import CheckpointError, checkpoint_files, load_tensors, read_config, read_header, tensor_shapes
from eagle3.init.pretrained import SKIPPED
from eagle3.init.pretrained import SPECFORGE_FLAGS as SPECFORGE_DEFAULTS
from eagle3.serve.parity import FLAGS, Served, check_served, sglang_aux_ids, target_model_type
from eagle3.verifier.model import Verifier


def specforge_config(config: dict[str, Any], draft_vocab_size: int, aux_ids: list[int]) -> dict[str, Any]:
    layer = config["transformer_layer_config"]
    out = {
        "architectures": ["LlamaForCausalLMEagle3"],
        # the decoder's own type and depth, so that SGLang's rules see them (it builds one Llama midlayer)
        "model_type": layer.get("model_type", "llama"),
        "num_hidden_layers": layer.get("num_hidden_layers", 1),
        "draft_vocab_size": draft_vocab_size,
        "tie_word_embeddings": False,
        "eagle_config": {"use_aux_hidden_state": True, "eagle_aux_hidden_state_layer_ids": aux_ids},
    }
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "head_dim", "max_position_embeddings", "rms_norm_eps", "hidden_act", "attention_bias", "mlp_bias",
                "torch_dtype", "dtype"):
        if key in layer:
            out[key] = layer[key]
    for flag in SPECFORGE_DEFAULTS:  # stated, so that nobody has to guess them back
        out[flag] = bool(config.get(flag, False))
    return out


def speculators_config(config: dict[str, Any], verifier: str | None) -> dict[str, Any]:
    """The checkpoint's config with what vLLM would otherwise guess stated: the norm flags (speculators'
    defaults where the checkpoint leaves them out, as speculators built the draft), untied embeddings, and the
    verifier vLLM loads (`--verifier`)."""
    from speculators.models.eagle3 import Eagle3SpeculatorConfig

    out = json.loads(json.dumps(config))
    for flag in FLAGS:
        out.setdefault(flag, Eagle3SpeculatorConfig.model_fields[flag].default)
    out["tie_word_embeddings"] = out["transformer_layer_config"]["tie_word_embeddings"] = False
    if verifier is not None:
        out["speculators_config"]["verifier"]["name_or_path"] = verifier
    return out


def expected_shapes(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    """The tensors, with their shapes, of the draft that `checkpoint`'s config.json describes (built by
    speculators on the meta device: no weights allocated)."""
    import torch

    from eagle3.init.build import draft_classes
    from eagle3.init.checkpoint import draft_kind

    model_class, config_class = draft_classes(draft_kind(checkpoint))
    try:
        config = config_class.from_pretrained(str(checkpoint))
        config.speculators_config.verifier.name_or_path = None  # shapes only: do not look for the verifier
        with torch.device("meta"):
            model = model_class(config)
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


def export(checkpoint: Path, out: Path, fmt: str = "speculators", verifier: str | None = None) -> list[str]:
    """Writes `out` after checking the checkpoint and what the format's engine will read from it; returns
    warnings for the user. Raises CheckpointError with nothing written when the checkpoint, what the engine
    would read, or `out` is unusable."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CheckpointError(f"--out {out} exists and is not an empty directory; nothing was overwritten")
    files = checkpoint_files(checkpoint, "checkpoint (eagle3 export's first argument)")
    config = read_config(checkpoint)
    kind = config.get("speculators_model_type")
    if kind not in ("eagle3", "peagle", "dflash"):
        raise CheckpointError(f"{checkpoint}/config.json is not a speculators EAGLE-3, P-EAGLE or DFlash config")
    if kind == "dflash" and fmt != "speculators":
        raise CheckpointError(f"{checkpoint} is a DFlash draft: the {fmt} layout is SGLang's EAGLE-3 drafter's; "
                              "export it with --format speculators, which vLLM serves (method: dflash)")
    if kind == "peagle" and fmt != "speculators":
        raise CheckpointError(f"{checkpoint} is a P-EAGLE draft: the {fmt} layout (SGLang) has no parallel "
                              "drafting (its EAGLE-3 drafter has no mask token, mask_hidden or trained embedding); "
                              "export it with --format speculators, which vLLM serves")
    shapes = tensor_shapes(files)  # every header checked against its file's size: not safetensors, truncated
    check_checkpoint(checkpoint, shapes, expected_shapes(checkpoint))
    warnings: list[str] = []
    if kind == "dflash":
        written = dflash_config(checkpoint, config, verifier)
    else:
        plan, warnings = planned(checkpoint, files, config, fmt, verifier)
        written = plan.config
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        _write(checkpoint, files, written, out, fmt)
    except BaseException:
        # A failure while writing leaves no half export behind: `out` was empty or absent.
        for child in out.iterdir():
            shutil.rmtree(child) if child.is_dir() else child.unlink()
        if created:
            out.rmdir()
        raise
    return warnings


def planned(checkpoint: Path, files: list[Path], config: dict[str, Any], fmt: str,
            verifier: str | None) -> tuple[Served, list[str]]:
    """The export as its engine will read it, checked by that engine's rules (eagle3/serve/parity.py)."""
    specs = {k: v for f in files for k, v in read_header(f).items()}
    layer = config["transformer_layer_config"]
    try:
        rope = read_rope(layer) or Rope(10000.0)
    except RopeError as e:
        raise CheckpointError(f"{checkpoint}/config.json states {e}; a one-layer draft has one RoPE") from None
    trained_with = config["speculators_config"]["verifier"].get("name_or_path")
    verifier_dir = local_verifier(verifier) or local_verifier(trained_with)  # --verifier may be a hub id
    verifier_config = read_verifier(verifier_dir)
    aux_ids = config.get("eagle_aux_hidden_state_layer_ids")
    if not isinstance(aux_ids, list):
        raise CheckpointError(f"{checkpoint}/config.json does not state eagle_aux_hidden_state_layer_ids: engines "
                              "would feed the draft their default layers, whatever it was trained on")
    d2t = load_tensors(files, {"d2t"}).get("d2t")
    target = target_model_type(verifier_config, config["speculators_config"]["verifier"].get("architectures"))
    if fmt == "speculators":
        out = speculators_config(config, verifier)
        out["transformer_layer_config"].update(engine_keys(rope))
        tensors = specs
    else:
        out = specforge_config(config, specs["lm_head.weight"].shape[0], sglang_aux_ids(aux_ids, target))
        out.update(engine_keys(rope))
        tensors = {specforge_name(k): v for k, v in specs.items() if k != "embed_tokens.weight"}
    served = Served(out, out.get("transformer_layer_config", out), tensors,
                    None if d2t is None else d2t.tolist(), aux_ids, rope, verifier_config,
                    embed_equal(files, verifier_dir) if "embed_tokens.weight" in tensors else None, target)
    refusals, warnings = check_served("vllm" if fmt == "speculators" else "sglang", served)
    if refusals:
        raise CheckpointError(f"{checkpoint}: the {fmt} export would be served otherwise than it was trained:\n  "
                              + "\n  ".join(refusals))
    if verifier_config is None:
        warnings.append("the verifier's config.json is not here (neither --verifier nor the checkpoint's verifier "
                        "path is a local model dir): its vocabulary, positions, RoPE, embed_tokens and the SGLang "
                        "aux-layer offset were not checked against it")
    return served, warnings


def specforge_name(key: str) -> str:
    return "midlayer." + key[len("layers.0."):] if key.startswith("layers.0.") else key


def local_verifier(name: Any) -> Path | None:
    path = Path(str(name)) if name else None
    return path if path is not None and Verifier(path).exists() else None


def read_verifier(path: Path | None) -> dict[str, Any] | None:
    """The decoder's part of the verifier's config.json (its text_config for a multimodal wrapper)."""
    return None if path is None else Verifier(path, key="--verifier").text


def embed_equal(files: list[Path], verifier_dir: Path | None) -> bool | None:
    """Whether the checkpoint's embed_tokens equals the verifier's (None: the verifier's weights are not here)."""
    import torch

    if verifier_dir is None:
        return None
    try:
        theirs_files = Verifier(verifier_dir, key="--verifier").weight_files()
    except UserError:
        return None
    names = [k for f in theirs_files for k in read_header(f) if k.endswith("embed_tokens.weight")]
    if len(names) != 1:
        return None
    ours = load_tensors(files, {"embed_tokens.weight"})["embed_tokens.weight"]
    theirs = load_tensors(theirs_files, set(names))[names[0]]
    return ours.shape == theirs.shape and torch.equal(ours, theirs.to(ours.dtype))


def dflash_config(checkpoint: Path, config: dict[str, Any], verifier: str | None) -> dict[str, Any]:
    """A DFlash checkpoint's config.json as vLLM's speculators reader (`update_dflash`) needs it: the aux layer ids
    and the mask token stated, the draft's RoPE in every key engines read, the verifier vLLM loads, and (a draft
    without sliding-window layers) sliding_window_non_causal true, without which vLLM runs the block causally
    (eagle3.arch.draft.DFLASH_NON_CAUSAL; speculators reads it for sliding-window layers only)."""
    if not isinstance(config.get("aux_hidden_state_layer_ids"), list) or not isinstance(config.get("mask_token_id"),
                                                                                        int):
        raise CheckpointError(f"{checkpoint}/config.json does not state aux_hidden_state_layer_ids and "
                              "mask_token_id: vLLM's DFlash reader requires both")
    try:
        rope = read_rope(config["transformer_layer_config"]) or Rope(10000.0)
    except RopeError as e:
        raise CheckpointError(f"{checkpoint}/config.json states {e}") from None
    out = json.loads(json.dumps(config))
    out["transformer_layer_config"].update(engine_keys(rope))
    if not has_sliding_layers(out):
        out[DFLASH_NON_CAUSAL] = True
    if verifier is not None:
        out["speculators_config"]["verifier"]["name_or_path"] = verifier
    return out


def _write(checkpoint: Path, files: list[Path], config: dict[str, Any], out: Path, fmt: str) -> None:
    from safetensors.torch import save_file

    if fmt == "speculators":
        index = [checkpoint / INDEX] * (len(files) > 1)
        for file in [*files, *index]:
            shutil.copy2(file, out / file.name)
    else:
        renamed = {specforge_name(k): v.contiguous() for k, v in load_tensors(files).items()
                   if k != "embed_tokens.weight"}
        save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
        written = tensor_shapes([out / "model.safetensors"])  # read back: what an engine will read
        if written != {k: tuple(v.shape) for k, v in renamed.items()}:
            raise CheckpointError(f"{out / 'model.safetensors'}: reads back other tensors than were written")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":  # the older path of `eagle3 export` (eagle3/cli/export.py)
    import runpy

    sys.argv[0:1] = ["eagle3", "export"]
    runpy.run_module("eagle3.cli", run_name="__main__")
