"""Initialize from a trained draft: speculators' layout (`layers.0.*`) or SpecForge/EAGLE's (`midlayer.*`).

Loading is strict: every tensor of the checkpoint is loaded with its shape checked, or skipped for a stated
reason, or the run stops with the full list of missing, unexpected and mismatched keys.

The vocabulary is where finetuning goes wrong silently. A draft's lm_head row i predicts target token
i + d2t[i]; a mapping rebuilt from new data moves most slots, and rows left in place then predict the
wrong tokens. `init.vocab`:
  keep     the checkpoint's d2t/t2d; the data's mapping is ignored
  rebuild  the data's mapping with the lm_head rows left where they were (the seed runs' failure: a baseline)
  remap    the data's mapping; row j of the new head is the old row of the same target token, and rows of
           tokens the old draft vocabulary lacked come from the verifier's lm_head (speculators' fresh init)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from eagle3.arch.draft import structure
from eagle3.arch.rope import Rope, RopeError, read_rope
from eagle3.config import (
    FLAGS,
    SPECULATORS_FLAGS,
    DraftConfig,
    DraftKind,
    PretrainedInitConfig,
    asked_flags,
    kind_flag_problem,
)
from eagle3.init.build import draft_rope, meta_draft, new_draft
from eagle3.init.files import CheckpointError, checkpoint_files, load_tensors, read_config, tensor_shapes
from eagle3.init.registry import InitContext, register

log = logging.getLogger(__name__)

SKIPPED = {
    "embed_tokens.weight": "taken from the verifier, frozen (speculators' draft never trains it)",
    "verifier_lm_head.weight": "the verifier's own head: taken from the verifier",
    "verifier_norm.weight": "the verifier's own final norm: taken from the verifier",
}


def skipped_keys(draft: DraftConfig) -> dict[str, str]:
    """The checkpoint tensors not loaded, with why; a P-EAGLE draft trains its embed_tokens, so its own is loaded."""
    if draft.kind == DraftKind.peagle:
        return {k: why for k, why in SKIPPED.items() if k != "embed_tokens.weight"}
    return SKIPPED


# SpecForge/EAGLE drafters: the residual is the un-normalized hidden state, fc sees the raw aux states, and
# the pre-norm output is fed to the next TTT step (speculators' converter defaults agree).
SPECFORGE_FLAGS = {"norm_before_residual": False, "norm_before_fc": False, "norm_output": False, "fc_norm": False}


@dataclass
class Source:
    path: Path
    files: list[Path]
    layout: str                               # speculators | specforge
    shapes: dict[str, tuple[int, ...]]        # after init.key_map
    keys: dict[str, str]                      # key in the file -> key after init.key_map
    stated_flags: dict[str, bool]
    stated_aux_ids: list[int] | None          # in Hugging Face output_hidden_states indexing
    stated_rope: Rope | None
    stated_structure: dict[str, Any]          # the decoder's model_type and num_hidden_layers, where stated
    kind: str = "eagle3"                      # eagle3.config.DraftKind: its speculators_model_type


def read_source(path: Path, key_map: dict[str, str]) -> Source:
    files = checkpoint_files(path, "init.path")
    config = read_config(path)
    raw = tensor_shapes(files)
    keys = {key: next((to + key[len(frm):] for frm, to in key_map.items() if key.startswith(frm)), key)
            for key in raw}
    shapes = {keys[k]: shape for k, shape in raw.items()}
    layout = "specforge" if any(k.startswith("midlayer.") for k in raw) else "speculators"
    stated = {k: bool(config[k]) for k in FLAGS if k in config}
    if layout == "specforge" and any(k.startswith("fc_norm.") for k in shapes):
        stated.setdefault("fc_norm", True)  # EAGLE 3.1 drafters carry per-aux norms
    ids = config.get("eagle_aux_hidden_state_layer_ids") or (config.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids")
    if ids is not None and layout == "specforge":
        ids = [i + 1 for i in ids]  # SpecForge counts layer outputs: output of layer k = hidden_states[k + 1]
    layer = config.get("transformer_layer_config") if layout == "speculators" else config
    try:
        rope = read_rope(layer) if isinstance(layer, dict) else None
    except RopeError as e:
        raise CheckpointError(f"{path}/config.json states {e}; a one-layer draft has one RoPE") from None
    stated_structure = {k: layer[k] for k in ("model_type", "num_hidden_layers")
                        if layout == "speculators" and isinstance(layer, dict) and k in layer}
    kind = config.get("speculators_model_type") if layout == "speculators" else None
    return Source(path, files, layout, shapes, keys, stated, ids, rope, stated_structure,
                  kind if isinstance(kind, str) else DraftKind.eagle3.value)


def is_explicit(overrides: list[str], key: str) -> bool:
    return any(o.lstrip("+").startswith(f"{key}=") for o in overrides)


def resolve_architecture(ctx: InitContext, source: Source) -> tuple[dict[str, bool], list[str]]:
    """The norm flags to build with, after comparing the run's model config with what the checkpoint says."""
    layout_defaults = SPECULATORS_FLAGS if source.layout == "speculators" else SPECFORGE_FLAGS
    checkpoint = {**layout_defaults, **source.stated_flags}
    notes = [f"{k}={layout_defaults[k]} (the {source.layout} layout's default: the checkpoint does not state it)"
             for k in FLAGS if k not in source.stated_flags]
    flags, conflicts = {}, []
    for k, run_value in asked_flags(ctx.draft).items():
        if run_value is None or run_value == checkpoint[k]:
            flags[k] = checkpoint[k]
        elif is_explicit(ctx.overrides, f"model.draft.{k}"):
            flags[k] = run_value
            notes.append(f"{k}={run_value} set on the command line; the checkpoint has {checkpoint[k]}")
        else:
            conflicts.append(f"model.draft.{k}: the run says {run_value}, the checkpoint {checkpoint[k]}")
    run_ids = list(ctx.draft.aux_layer_ids)
    if source.stated_aux_ids is not None and source.stated_aux_ids != run_ids:
        if is_explicit(ctx.overrides, "model.draft.aux_layer_ids"):
            notes.append(f"aux_layer_ids={run_ids} set on the command line; the checkpoint has "
                         f"{source.stated_aux_ids}")
        else:
            conflicts.append(f"model.draft.aux_layer_ids: the run says {run_ids}, the checkpoint "
                             f"{source.stated_aux_ids} (Hugging Face hidden_states indexing)")
    if source.stated_aux_ids is None:
        notes.append(f"aux_layer_ids: the checkpoint does not state them; using the run's {run_ids}")
    rope_note, rope_conflict = compare_rope(ctx, source.stated_rope)
    notes += rope_note
    conflicts += rope_conflict
    # What the weights are: no override loads a checkpoint into another kind, decoder type or depth of draft.
    names = {"model_type": "model.draft.layer_type", "num_hidden_layers": "model.draft.num_layers"}
    fixed = [(names[k], v, source.stated_structure[k], "") for k, v in structure(ctx.draft).items()
             if source.stated_structure.get(k, v) != v]
    if source.kind != DraftKind(ctx.draft.kind).value:
        fixed.append(("model.draft.kind", DraftKind(ctx.draft.kind).value, source.kind,
                      " (its speculators_model_type)"))
    unservable = kind_flag_problem(ctx.draft.kind, flags) if not fixed else None
    if not conflicts and not fixed and unservable:
        raise CheckpointError(f"{source.path} gives this P-EAGLE draft EAGLE-3.1's norms ({unservable}): no engine "
                              f"would serve the finetuned draft as trained; start P-EAGLE from a checkpoint without "
                              f"fc_norm, or finetune it as model.draft.kind=eagle3")
    if not conflicts and not fixed:
        return flags, notes
    lines = [f"{key}: the run says {run}, the checkpoint {theirs}{why}" for key, run, theirs, why in fixed]
    advice = []
    if fixed:
        keys = " ".join(f"{key}={theirs}" for key, _, theirs, _ in fixed)
        advice.append(f"{', '.join(key for key, *_ in fixed)}: the checkpoint's weights are those of its own "
                      f"architecture and load into no other, whatever the command line says; to start from it set "
                      f"{keys}, or train this architecture with init=scratch")
    if conflicts:
        advice.append(("the others: " if fixed else "") + "set the run's values to the checkpoint's, or set them on "
                      "the command line to override the checkpoint")
    raise CheckpointError(f"{source.path} was trained with another architecture than this run's model config:\n  "
                          + "\n  ".join(lines + conflicts) + "\n" + "\n".join(advice))


ROPE_KEYS = ("rope_theta", "rope_scaling", "partial_rotary_factor")


def compare_rope(ctx: InitContext, stated: Rope | None) -> tuple[list[str], list[str]]:
    """(notes, conflicts) of the run's RoPE against the checkpoint's: a difference is the user's stated choice
    (a model.draft RoPE key on the command line) or a conflict."""
    run = draft_rope(ctx.draft)
    if stated is None:
        return [f"RoPE: the checkpoint does not state it; using the run's ({run})"], []
    if stated == run:
        return [], []
    if any(is_explicit(ctx.overrides, f"model.draft.{k}") for k in ROPE_KEYS):
        return [f"RoPE ({run}) set on the command line; the checkpoint has {stated}"], []
    return [], [f"RoPE: the run says {run}, the checkpoint {stated} (model.draft.{', model.draft.'.join(ROPE_KEYS)})"]


def plan_load(shapes: dict[str, tuple[int, ...]], model_shapes: dict[str, tuple[int, ...]],
              skip: dict[str, str] = SKIPPED) -> dict[str, Any]:
    """Which checkpoint tensor goes where (`skip`: those not loaded, with why). Raises with every missing,
    unexpected and mismatched key."""
    loaded, skipped, unexpected, mismatched = [], {}, [], []
    for key, shape in sorted(shapes.items()):
        if key in skip:
            skipped[key] = skip[key]
        elif key in ("d2t", "t2d"):
            continue
        elif key not in model_shapes:
            unexpected.append(f"{key} {list(shape)}")
        elif key == "lm_head.weight" and shape[1:] == model_shapes[key][1:]:
            continue  # rows are the vocabulary policy's business
        elif shape != model_shapes[key]:
            mismatched.append(f"{key}: checkpoint {list(shape)}, model {list(model_shapes[key])}")
        else:
            loaded.append(key)
    missing = [f"{k} {list(s)}" for k, s in sorted(model_shapes.items())
               if k not in shapes and k not in skip and k not in ("d2t", "t2d")]
    return {"loaded": loaded, "skipped": skipped, "missing": missing, "unexpected": unexpected,
            "mismatched": mismatched}


def check_plan(plan: dict[str, Any], source: Source) -> None:
    problems = [(name, plan[name]) for name in ("missing", "unexpected", "mismatched") if plan[name]]
    if problems:
        lines = [f"{name} ({len(items)}):\n    " + "\n    ".join(items) for name, items in problems]
        raise CheckpointError(f"{source.path} does not fit the run's draft (model.draft):\n  " + "\n  ".join(lines))


def options(ctx: InitContext) -> PretrainedInitConfig:
    """The init options of a pretrained init (the launcher typed them by init.name)."""
    assert isinstance(ctx.init, PretrainedInitConfig), type(ctx.init)
    return ctx.init


def check_vocab(ctx: InitContext, source: Source) -> None:
    policy, draft, shapes = options(ctx).vocab.value, ctx.draft, source.shapes
    if "t2d" in shapes and shapes["t2d"][0] != draft.vocab_size:
        raise CheckpointError(f"{source.path}: the checkpoint's target vocabulary has {shapes['t2d'][0]} tokens "
                              f"(t2d), the verifier {draft.vocab_size} (model.draft.vocab_size)")
    rows = shapes.get("lm_head.weight", (0,))[0]
    if "d2t" not in shapes and rows != draft.vocab_size:
        raise CheckpointError(f"{source.path}: lm_head has {rows} rows but no d2t/t2d mapping, and the verifier "
                              f"vocabulary has {draft.vocab_size} tokens")
    if policy in ("keep", "rebuild") and rows != draft.draft_vocab_size:
        raise CheckpointError(f"init.vocab={policy} keeps the checkpoint's {rows} lm_head rows, but "
                              f"model.draft.draft_vocab_size is {draft.draft_vocab_size}: set it to {rows} "
                              "(or use init.vocab=remap)")


def preflight(ctx: InitContext) -> Source:
    """Every check that needs no weights, at full size on the meta device: run before any rank starts."""
    source = read_source(Path(options(ctx).path), dict(options(ctx).key_map))
    flags, _ = resolve_architecture(ctx, source)
    check_vocab(ctx, source)
    model_shapes = {k: tuple(v.shape) for k, v in meta_draft(ctx.draft, flags).state_dict().items()}
    check_plan(plan_load(source.shapes, model_shapes, skipped_keys(ctx.draft)), source)
    return source


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """Target token id of each draft slot: i + d2t[i]."""
    return torch.arange(len(d2t)) + d2t


@register("pretrained", preflight=preflight)
def init_pretrained(ctx: InitContext) -> tuple[Any, dict[str, Any]]:
    from eagle3.formats.vocab import read_token_freq, vocab_mapping

    source = read_source(Path(options(ctx).path), dict(options(ctx).key_map))
    flags, notes = resolve_architecture(ctx, source)
    check_vocab(ctx, source)
    skip = skipped_keys(ctx.draft)
    wanted = {raw for raw, key in source.keys.items() if key not in skip}  # embed_tokens can be GBs
    weights = {source.keys[k]: v for k, v in load_tensors(source.files, wanted).items()}

    draft, policy = ctx.draft, options(ctx).vocab.value
    old_lm_head = weights["lm_head.weight"]
    old_d2t = weights["d2t"].long() if "d2t" in weights else torch.zeros(old_lm_head.shape[0], dtype=torch.long)
    old_t2d = weights["t2d"].bool() if "t2d" in weights else torch.ones(draft.vocab_size, dtype=torch.bool)
    old_ids = target_ids(old_d2t)
    if not torch.equal(torch.nonzero(old_t2d).flatten(), old_ids):
        raise CheckpointError(f"{source.path}: d2t and t2d disagree (t2d's tokens are not i + d2t[i])")
    data_d2t, data_t2d = vocab_mapping(ctx.data_dir, draft.draft_vocab_size, draft.vocab_size)
    d2t, t2d = (old_d2t, old_t2d) if policy == "keep" else (data_d2t, data_t2d)
    model = new_draft(draft, flags, ctx.attn_impl, str(ctx.verifier_dir), t2d, d2t)
    model_state = model.state_dict()
    plan = plan_load(source.shapes, {k: tuple(v.shape) for k, v in model_state.items()}, skip)
    check_plan(plan, source)
    new_ids = target_ids(d2t)
    with torch.no_grad():
        for key in plan["loaded"]:
            model_state[key].copy_(weights[key].to(model_state[key].dtype))
        copied = copy_lm_head(model.lm_head.weight, old_lm_head, old_ids, new_ids, policy, draft.vocab_size)
    model.lm_head.weight.requires_grad_(bool(options(ctx).train_lm_head))

    freq = read_token_freq(ctx.data_dir)
    total = sum(freq.values()) or 1
    overlap = set(old_ids.tolist()) & set(target_ids(data_d2t).tolist())
    report = {
        "initializer": "pretrained",
        "path": str(source.path),
        "layout": source.layout,
        "files": [str(f) for f in source.files],
        "keys": {"loaded": plan["loaded"] + ["lm_head.weight"],
                 "renamed": {k: v for k, v in source.keys.items() if k != v}, "skipped": plan["skipped"]},
        "renamed_prefixes": dict(options(ctx).key_map),
        "architecture": {"flags": flags, "aux_layer_ids": list(draft.aux_layer_ids), "notes": notes},
        "vocab": {
            "policy": policy,
            "draft_vocab_size": len(d2t),
            # Slots whose offset moved: the seed run's "31,748 of 32,000". It overstates the damage a remap
            # repairs; the overlap of target ids below is what a remap keeps.
            "d2t_positional_differences": (int((old_d2t != data_d2t).sum()) if len(old_d2t) == len(data_d2t)
                                           else None),
            "target_id_overlap": len(overlap),
            "data_token_share_covered_by_overlap": sum(freq.get(i, 0) for i in overlap) / total,
            "data_token_share_covered_by_draft_vocab": sum(freq.get(i, 0) for i in new_ids.tolist()) / total,
            "lm_head_rows_from_checkpoint": copied,
            "lm_head_rows_from_verifier": len(d2t) - copied,
            "lm_head_trainable": bool(options(ctx).train_lm_head),
        },
    }
    log_report(report)
    return model, report


def copy_lm_head(head: torch.Tensor, old_lm_head: torch.Tensor, old_ids: torch.Tensor, new_ids: torch.Tensor,
                 policy: str, vocab_size: int) -> int:
    """The checkpoint's lm_head rows copied into the new draft's `head` (in place, under no_grad): all of them (keep,
    rebuild), or those of the tokens both vocabularies hold (remap; the others keep the verifier's rows, as
    speculators initializes them). How many rows came from the checkpoint."""
    if policy in ("keep", "rebuild"):
        head.copy_(old_lm_head.to(head.dtype))
        return head.shape[0]
    position = torch.full((vocab_size,), -1, dtype=torch.long)
    position[old_ids] = torch.arange(len(old_ids))
    source_row = position[new_ids]
    kept = source_row >= 0
    head[kept] = old_lm_head[source_row[kept]].to(head.dtype)
    return int(kept.sum())


def log_report(report: dict[str, Any]) -> None:
    v, keys = report["vocab"], report["keys"]
    log.info("init=pretrained from %s (%s layout): %d tensors loaded, %d renamed, %d skipped (%s)", report["path"],
             report["layout"], len(keys["loaded"]), len(keys["renamed"]), len(keys["skipped"]),
             ", ".join(keys["skipped"]) or "none")
    for note in report["architecture"]["notes"]:
        log.info("  %s", note)
    log.info("  vocab=%s: d2t differs from this data's mapping at %s of %d slots; %d target ids in common, "
             "covering %.1f%% of this data's tokens; lm_head rows: %d from the checkpoint, %d from the verifier",
             v["policy"], v["d2t_positional_differences"], v["draft_vocab_size"], v["target_id_overlap"],
             100 * v["data_token_share_covered_by_overlap"], v["lm_head_rows_from_checkpoint"],
             v["lm_head_rows_from_verifier"])
