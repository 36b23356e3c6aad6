"""Initializers: how the draft model starts. Each takes an InitContext and returns the model and a report.

New initializers register themselves with `@register("<name>")` and get a config file `conf/init/<name>.yaml`
whose `name` key selects them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from speculators.models.eagle3 import Eagle3DraftModel


@dataclass
class InitContext:
    draft: dict[str, Any]      # model.draft of the run config
    init: dict[str, Any]       # init of the run config
    verifier_dir: Path
    data_dir: Path
    attn_impl: str             # resolved: sdpa | eager | simple_flex_attention


Initializer = Callable[[InitContext], "tuple[Eagle3DraftModel, dict[str, Any]]"]
_REGISTRY: dict[str, Initializer] = {}


def register(name: str) -> Callable[[Initializer], Initializer]:
    def add(fn: Initializer) -> Initializer:
        _REGISTRY[name] = fn
        return fn
    return add


def build_draft(ctx: InitContext) -> "tuple[Eagle3DraftModel, dict[str, Any]]":
    name = ctx.init["name"]
    if name not in _REGISTRY:
        raise KeyError(f"init.name={name!r} has no initializer; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name](ctx)


from eagle3.init import scratch  # noqa: E402,F401  (registers itself)
