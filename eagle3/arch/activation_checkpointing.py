"""Gradient checkpointing of the draft's decoder layers (`model.draft.gradient_checkpointing`): each layer's
activations are recomputed in the backward instead of being kept from the forward.

Neither speculators 0.9 nor transformers can do this for an EAGLE-3 draft: speculators has no switch, and
transformers' own (`GradientCheckpointingLayer`) drops `past_key_values` under checkpointing, while the draft's
test-time-training steps attend to the keys and values of all earlier steps through that cache. A recomputed
forward must also not write the cache a second time. So each layer call runs under `torch.utils.checkpoint`
as a pure function of (hidden states, the earlier steps' keys, values): it gets a private cache seeded with
them, and returns its output with the step's new keys and values, which are then appended to the real cache
outside the checkpoint. The loss and gradients are those of the plain forward (tests/plan/test_plan.py).
"""

from __future__ import annotations

import types

import torch
from torch.utils.checkpoint import checkpoint
from transformers import DynamicCache


def recompute_decoder_layers(model: torch.nn.Module) -> torch.nn.Module:
    """Turns on recomputation for every decoder layer of an Eagle3DraftModel (all model.draft.num_layers of them,
    llama or qwen3), in place; returns the model.
    Parameter names and the saved checkpoint format do not change (the layers are patched, not wrapped)."""
    for layer in model.layers:
        layer.forward = types.MethodType(_recomputed_forward, layer)
        layer._plain_forward = types.MethodType(type(layer).forward, layer)
    return model


def _recomputed_forward(self, hidden_states: torch.Tensor, *args, past_key_values=None, **kwargs) -> torch.Tensor:
    if not (self.training and torch.is_grad_enabled()) or past_key_values is None:
        return self._plain_forward(hidden_states, *args, past_key_values=past_key_values, **kwargs)
    idx = self.self_attn.layer_idx
    cached = past_key_values.layers[idx] if idx < len(past_key_values.layers) else None
    past = (cached.keys, cached.values) if cached is not None and cached.is_initialized else ()
    new_len = hidden_states.shape[1]

    def layer_step(h: torch.Tensor, *past_kv: torch.Tensor):
        private = DynamicCache()
        if past_kv:
            private.update(past_kv[0], past_kv[1], idx)
        out = self._plain_forward(h, *args, past_key_values=private, **kwargs)
        keys, values = private.layers[idx].keys, private.layers[idx].values
        return out, keys[..., -new_len:, :], values[..., -new_len:, :]

    out, new_keys, new_values = checkpoint(layer_step, hidden_states, *past, use_reentrant=False)
    past_key_values.update(new_keys, new_values, idx)
    return out
