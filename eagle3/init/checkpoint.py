"""Checkpoints in speculators' format (config.json + model.safetensors), which vLLM serves.

`checkpoints/last` also holds `trainer_state.pt` (optimizer, scheduler, step, data position, RNG) for
resume. A checkpoint is written to a temporary sibling (`.last.tmp`) and renamed into place, the previous one
moved aside (`.last.old`) meanwhile, so a kill during a save never leaves a directory that fails to load; a kill
between the two renames leaves both siblings whole, and a resume takes the newer one (`resumable_last`). A save
that finds the disk full removes its temporary sibling and keeps the previous checkpoint.
"""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from eagle3.errors import CheckpointError, RunStopped, UserError
from eagle3.formats.disk import check_free, disk_full
from eagle3.safe_write import replace_dir

log = logging.getLogger(__name__)

TRAINER_STATE = "trainer_state.pt"


def save_checkpoint(model: torch.nn.Module, state_dict: dict[str, torch.Tensor], target: Path,
                    trainer_state: dict[str, Any] | None = None, base: Path | None = None) -> Path:
    """Writes `state_dict` through `model.save_pretrained` (plus the trainer state, if given) atomically. A write
    that fails (a full disk) removes the half-written temporary dir and raises `SaveFailed`; `target` is untouched.
    Nothing is written through a symlink between `base` (default: the run dir, `target`'s grandparent) and
    `target` (eagle3.safe_write: a link at `target` is refused, one at a temporary name removed)."""
    tmp, old = sibling(target, "tmp"), sibling(target, "old")
    full = []  # whether the disk was full when the write failed (asked before the half-written dir is removed)

    def build(tmp: Path) -> None:
        try:
            model.save_pretrained(str(tmp), state_dict=state_dict)
            if trainer_state is not None:
                torch.save(trainer_state, tmp / TRAINER_STATE)
        except Exception as e:  # safetensors, torch.save and plain writes each say "disk full" in their own way
            full.append(disk_full(e, target.parent))
            raise

    try:
        replace_dir(target.parent.parent if base is None else base, target, build, tmp, old)
    except Exception as e:
        if isinstance(e, UserError) or not any(full):
            raise
        free = shutil.disk_usage(target.parent).free
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise SaveFailed(f"cannot write {target}: no space left on its filesystem ({reason}); the half-written "
                         f"{tmp.name} was removed ({free / 2**30:.2f} GiB free now), and {target.name} "
                         f"{'is the previous one, whole' if target.exists() else 'was not written'}") from None
    return target


class SaveFailed(RunStopped):
    """A checkpoint could not be written (the disk is full); the previous one is kept."""


def sibling(target: Path, kind: str) -> Path:
    """The temporary (`tmp`) or replaced (`old`) dir of a save of `target`, beside it: `.<name>.<kind>`."""
    return target.with_name(f".{target.name}.{kind}")


def check_disk(run_dir: Path, model: torch.nn.Module) -> None:
    """Refuses to start when the run dir's filesystem cannot hold two checkpoints (`last` with its optimizer
    state, and `best`), so that a long run does not die at its first save."""
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    optimizer = sum(2 * p.numel() * 4 for p in model.parameters() if p.requires_grad)  # AdamW's two fp32 moments
    check_free(run_dir, 2 * (2 * weights + optimizer),
               "the checkpoints of this run (last with optimizer state, and best, each written beside the previous "
               "one before it is replaced)", "free space or choose another hydra.run.dir")


def load_trainer_state(checkpoint: Path, mmap: bool = False) -> dict[str, Any]:
    """trainer_state.pt of a checkpoint, as tensors and plain values only (never unpickling code); `mmap`: read
    lazily, to check that it loads."""
    file = checkpoint / TRAINER_STATE
    if not file.is_file():
        raise CheckpointError(f"{file} is missing: {checkpoint} holds no resumable state")
    try:
        with warnings.catch_warnings():  # torch warns about a foreign pickle's protocol before refusing it
            warnings.simplefilter("ignore", UserWarning)
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:  # a truncated zip, garbage, or a pickle that holds more than tensors and plain values
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise CheckpointError(f"{file} cannot be read as a trainer state ({type(e).__name__}"
                              f"{': ' + first[:200] if first and 'weights_only' not in first else ''}); "
                              "it is damaged or was not written by eagle3") from None
    if not isinstance(state, dict) or not {"progress", "optimizer", "scheduler", "rng"} <= set(state):
        raise CheckpointError(f"{file} is not a trainer state (no progress, optimizer, scheduler and rng)")
    return state


def check_draft_files(path: Path) -> None:
    """That `path` is a local checkpoint dir whose config.json is a JSON object and whose weights' headers agree
    with their sizes; one message naming the file otherwise (a missing local dir is never taken as a hub id)."""
    from eagle3.init.files import checkpoint_files, read_config, read_header

    if not path.is_dir():
        raise CheckpointError(f"{path} does not exist or is not a directory (a draft checkpoint dir with "
                              "config.json and model.safetensors)")
    if not isinstance(read_config(path), dict):
        raise CheckpointError(f"{path / 'config.json'}: not a JSON object")
    for file in checkpoint_files(path, "the draft checkpoint"):
        read_header(file)


def resumable_last(checkpoints: Path) -> Path:
    """`checkpoints/last`, checked whole (config, weights, trainer state). When a kill between a save's two
    renames left no `last` but its `.last.tmp` (the new one, written completely before the renames) and
    `.last.old` (the previous one), the whole one of them, newest first, becomes `last` again, and the log says
    so."""
    last = checkpoints / "last"
    if last.exists():
        check_draft_files(last)
        load_trainer_state(last, mmap=True)
        return last
    problems = []
    for candidate in (sibling(last, "tmp"), sibling(last, "old")):
        if not candidate.is_dir() or candidate.is_symlink():  # a link is not a save of ours
            continue
        try:
            check_draft_files(candidate)
            step = load_trainer_state(candidate, mmap=True)["progress"]["step"]
        except CheckpointError as e:
            problems.append(str(e))
            continue
        os.replace(candidate, last)
        log.warning("%s was missing (a save was stopped between its renames): resuming from %s, whole, at step %d "
                    "(now %s)", last, candidate.name, step, last)
        return last
    found = f"; and neither .last.tmp nor .last.old is whole: {'; '.join(problems)}" if problems else ""
    raise CheckpointError(f"{last} is missing: no resumable checkpoint{found}")


def load_draft(path: str | Path, attn_impl: str = "sdpa", device: str | torch.device = "cpu",
               verifier_dir: str | Path | None = None):
    """Loads a speculators checkpoint with an attention implementation that works on `device`.

    speculators does not save the attention implementation and falls back to flex attention, which has
    no backward on CPU, so the config is loaded first and told which one to use. `verifier_dir` replaces the
    verifier path the checkpoint recorded: speculators reads the verifier's lm_head and norm (not saved in
    the checkpoint) and checks the aux layer ids from there.
    """
    from eagle3.init.build import draft_classes, with_own_attention

    check_draft_files(Path(path))
    kind = draft_kind(Path(path))
    model_class, config_class = draft_classes(kind)
    try:
        config = config_class.from_pretrained(str(path))
    except Exception as e:  # pydantic's or transformers' own errors for a config of another kind
        raise CheckpointError(f"{Path(path) / 'config.json'} is not a speculators Eagle-3 config "
                              f"({type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''})"
                              ) from None
    config.transformer_layer_config._attn_implementation = attn_impl
    if verifier_dir is not None:
        config.speculators_config.verifier.name_or_path = str(verifier_dir)
    model = model_class.from_pretrained(str(path), config=config)
    return with_own_attention(model, kind).to(device)


def draft_kind(path: Path) -> str:
    """The checkpoint's draft kind (eagle3.config.DraftKind) by its config's speculators_model_type, read through
    eagle3.init.files.read_config (the one reader of a draft checkpoint's config.json)."""
    from eagle3.arch.draft import draft_kind_of
    from eagle3.init.files import read_config

    try:
        config = read_config(path)
    except CheckpointError:
        config = {}  # the config class's own reading says what is wrong with it
    return draft_kind_of(config)
