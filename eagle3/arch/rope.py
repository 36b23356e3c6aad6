"""RoPE parameters: read from any Hugging Face-style config dict, compared, and written where engines read them.

Configs state RoPE in two schemas. transformers 5 keeps it in one dict, `rope_parameters` {rope_theta, rope_type,
the type's factors, partial_rotary_factor}; older configs (and SpecForge's) have top-level `rope_theta`,
`rope_scaling` {type or rope_type, factors} and `partial_rotary_factor`. vLLM reads `rope_parameters` with
partial_rotary_factor inside it; SGLang reads `rope_parameters` (else `rope_scaling`) and partial_rotary_factor at
the top level (docs: /work/shared/notes/serving.md, P11). A draft is one decoder layer with one RoPE, so a
verifier with a RoPE per layer type is not mirrored: its RoPE must be set by hand.

Plain dict logic, no imports beyond the standard library: the run config resolves it (model=auto).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class RopeError(ValueError):
    """A config whose RoPE a one-layer draft cannot mirror."""


@dataclass
class Rope:
    theta: float
    scaling: dict[str, Any] | None = None   # rope_type and its factors; None: default RoPE
    partial_rotary_factor: float = 1.0

    def __str__(self) -> str:
        scaling = "default RoPE" if self.scaling is None else ", ".join(f"{k}={v}" for k, v in self.scaling.items())
        return f"rope_theta={self.theta:g}, {scaling}, partial_rotary_factor={self.partial_rotary_factor:g}"


def read_rope(config: dict[str, Any]) -> Rope | None:
    """The RoPE a config states, from either schema (rope_parameters wins over the legacy keys); None when it
    states no rope_theta at all. Raises RopeError for a RoPE per layer type."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and any(isinstance(v, dict) for v in params.values()):
        raise RopeError(f"a RoPE per layer type ({', '.join(k for k, v in params.items() if isinstance(v, dict))})")
    merged: dict[str, Any] = {}
    for part in (config.get("rope_scaling"), params):
        if isinstance(part, dict):
            merged.update(part)
    theta = merged.pop("rope_theta", None) or config.get("rope_theta")
    if theta is None:
        return None
    factor = merged.pop("partial_rotary_factor", None) or config.get("partial_rotary_factor") or 1.0
    legacy_type = merged.pop("type", None)  # transformers 4's name of rope_type
    kind = merged.pop("rope_type", None) or legacy_type or "default"
    scaling = None if kind == "default" and not merged else {"rope_type": kind, **merged}
    return Rope(float(theta), scaling, float(factor))


def rope_parameters(rope: Rope) -> dict[str, Any]:
    """transformers 5's `rope_parameters` of `rope`."""
    out = {"rope_theta": rope.theta, "rope_type": "default", **(rope.scaling or {})}
    if rope.partial_rotary_factor != 1.0:
        out["partial_rotary_factor"] = rope.partial_rotary_factor
    return out


def engine_keys(rope: Rope) -> dict[str, Any]:
    """`rope` in every schema an engine reads: rope_parameters (vLLM, SGLang), the mirrored legacy rope_scaling
    (null for default RoPE; no legacy `type` key: transformers merges rope_scaling into rope_parameters on load,
    and vLLM's config check rejects `type` there), top-level rope_theta and partial_rotary_factor (SGLang)."""
    return {"rope_parameters": rope_parameters(rope), "rope_scaling": rope.scaling, "rope_theta": rope.theta,
            "partial_rotary_factor": rope.partial_rotary_factor}
