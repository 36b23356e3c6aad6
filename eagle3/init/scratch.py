"""A fresh draft, exactly as speculators builds one for training."""

from __future__ import annotations

from typing import Any

from eagle3.arch.draft import resolved_flags
from eagle3.config import SPECULATORS_FLAGS
from eagle3.init.build import new_draft
from eagle3.init.registry import InitContext, register


@register("scratch")
def init_scratch(ctx: InitContext) -> tuple[Any, dict[str, Any]]:
    from eagle3.formats.vocab import vocab_mapping

    draft = ctx.draft
    d2t, t2d = vocab_mapping(ctx.data_dir, draft.draft_vocab_size, draft.vocab_size)
    flags = resolved_flags(draft, SPECULATORS_FLAGS)
    model = new_draft(draft, flags, ctx.attn_impl, str(ctx.verifier_dir), t2d, d2t)
    report = {"initializer": "scratch", "flags": flags, "draft_vocab_size": draft.draft_vocab_size,
              "vocab": "built from the data's token frequencies (token_freq.pt)"}
    return model, report
