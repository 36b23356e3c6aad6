"""The initializers' registry and the context each is given (eagle3.init re-exports them); the initializers import
it, not the package, so that the package can import them without a circle."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eagle3.config import DraftConfig, InitConfig

if TYPE_CHECKING:
    from speculators.models.eagle3 import Eagle3DraftModel


@dataclass
class InitContext:
    draft: DraftConfig         # model.draft of the run config
    init: InitConfig           # init of the run config: the options schema of init.name
    verifier_dir: Path
    data_dir: Path
    attn_impl: str             # resolved: sdpa | eager | simple_flex_attention
    overrides: list[str]       # the command line's overrides: a value set there is the user's explicit choice


Initializer = Callable[[InitContext], "tuple[Eagle3DraftModel, dict[str, Any]]"]
Preflight = Callable[[InitContext], Any]
_REGISTRY: dict[str, tuple[Initializer, Preflight | None]] = {}


def register(name: str, preflight: Preflight | None = None) -> Callable[[Initializer], Initializer]:
    """Registers an initializer; `preflight` runs its weight-free checks in the launcher, before any rank starts."""
    def add(fn: Initializer) -> Initializer:
        _REGISTRY[name] = (fn, preflight)
        return fn
    return add


def _lookup(name: str) -> tuple[Initializer, Preflight | None]:
    if name not in _REGISTRY:
        raise KeyError(f"init.name={name!r} has no initializer; known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def preflight_draft(ctx: InitContext) -> None:
    check = _lookup(ctx.init.name)[1]
    if check is not None:
        check(ctx)


def build_draft(ctx: InitContext) -> tuple[Eagle3DraftModel, dict[str, Any]]:
    return _lookup(ctx.init.name)[0](ctx)

