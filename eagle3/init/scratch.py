"""A fresh draft, exactly as speculators builds one for training."""

from __future__ import annotations

from typing import Any

from eagle3.init import InitContext, register


def draft_layer_config(draft: dict[str, Any], attn_impl: str):
    """The 1-layer Llama decoder config of the draft (speculators calls it `verifier_config`, but it is the draft's)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        vocab_size=draft["vocab_size"],
        hidden_size=draft["hidden_size"],
        intermediate_size=draft["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=draft["num_attention_heads"],
        num_key_value_heads=draft["num_key_value_heads"],
        head_dim=draft["head_dim"],
        max_position_embeddings=draft["max_position_embeddings"],
        rope_theta=draft["rope_theta"],
        rms_norm_eps=draft["rms_norm_eps"],
        hidden_act=draft["hidden_act"],
        tie_word_embeddings=False,
    )
    config._attn_implementation = attn_impl
    return config


@register("scratch")
def init_scratch(ctx: InitContext):
    from speculators.models.eagle3 import Eagle3DraftModel

    from eagle3.data.loader import vocab_mapping

    draft = ctx.draft
    d2t, t2d = vocab_mapping(ctx.data_dir, draft["draft_vocab_size"], draft["vocab_size"])
    model = Eagle3DraftModel.from_training_args(
        verifier_config=draft_layer_config(draft, ctx.attn_impl),
        t2d=t2d,
        d2t=d2t,
        verifier_name_or_path=str(ctx.verifier_dir),
        target_layer_ids=list(draft["aux_layer_ids"]),
        draft_vocab_size=draft["draft_vocab_size"],
        norm_before_residual=draft["norm_before_residual"],
        norm_before_fc=draft["norm_before_fc"],
        norm_output=draft["norm_output"],
        ttt_steps=draft["ttt_steps"],
        draft_attn_impl=ctx.attn_impl,
    )
    report = {"initializer": "scratch", "draft_vocab_size": int(t2d.sum()) if t2d is not None else draft["vocab_size"]}
    return model, report
