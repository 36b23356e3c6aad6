"""The verifier layers a trained draft reads, as its checkpoint says, checked against the verifier it drafts for."""

from __future__ import annotations

import torch

from eagle3.errors import ConfigError


def aux_layer_ids(draft: torch.nn.Module, verifier: torch.nn.Module) -> list[int]:
    """The draft's aux layer ids (its config, as saved in the checkpoint), checked against the verifier."""
    config = draft.config  # DFlash's config names them aux_hidden_state_layer_ids
    ids = list(getattr(config, "eagle_aux_hidden_state_layer_ids", None)
               or getattr(config, "aux_hidden_state_layer_ids", None) or [])
    layers = verifier.config.num_hidden_layers
    if not ids or not all(0 <= i < layers for i in ids):
        # Id == layers would be Hugging Face's post-norm output, not what vLLM or eagle3's data give.
        raise ConfigError(f"the draft's eagle_aux_hidden_state_layer_ids {ids} must lie in [0, {layers}) for "
                          f"this verifier of {layers} layers")
    if draft.fc.in_features != len(ids) * verifier.config.hidden_size:
        raise ConfigError(f"the draft's fc takes {draft.fc.in_features} inputs, but {len(ids)} aux layers of the "
                          f"verifier give {len(ids) * verifier.config.hidden_size}: another verifier?")
    return ids
