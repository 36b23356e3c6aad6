"""Hydra sweep overrides -> Optuna distributions, and sampled values -> overrides.

The syntax is Hydra's override grammar, parsed by Hydra's own parser, as in hydra-optuna-sweeper:

    optim.lr=tag(log, interval(1e-5, 1e-2))     float, log-uniform
    optim.warmup_ratio=interval(0, 0.1)         float, uniform
    optim.epochs=int(interval(1, 5))            int, uniform (tag(log, int(interval(...))): log-uniform)
    optim.epochs=range(1, 6, 2)                 int with a step: 1, 3, 5 (Hydra's stop is exclusive)
    optim.scheduler=choice(cosine, linear)      categorical (also the plain form a,b,c)

Anything else (`optim.epochs=1`) is fixed: passed unchanged to every trial. Optuna is imported inside the
functions: Hydra imports every plugin module at start-up, `launch.py --help` included.
"""

from __future__ import annotations

from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer


def parse_search_space(arguments: list[str]) -> tuple[dict[str, Any], list[str]]:
    """({key: Optuna distribution} for the sweep overrides, [the other overrides, as given])."""
    space: dict[str, Any] = {}
    fixed: list[str] = []
    for override in OverridesParser.create().parse_overrides(arguments):
        if override.is_sweep_override():
            space[override.get_key_element()] = to_distribution(override)
        else:
            fixed.append(override.input_line or f"{override.get_key_element()}={override.get_value_element_as_str()}")
    return space, fixed


def to_distribution(override: Override) -> Any:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    value, key = override.value(), override.get_key_element()
    if isinstance(value, IntervalSweep):
        log = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log)
        return FloatDistribution(float(value.start), float(value.end), log=log)
    if isinstance(value, RangeSweep) and not value.shuffle and all(
            isinstance(x, int) for x in (value.start, value.stop, value.step)):
        values = list(range(value.start, value.stop, value.step))
        if not values:
            raise ValueError(f"{override.input_line}: the range is empty")
        return IntDistribution(min(values), max(values), step=abs(value.step))
    if isinstance(value, (ChoiceSweep, RangeSweep)):  # choices; a float range is its list of values
        choices = [Transformer.encode(x) for x in override.sweep_iterator(transformer=Transformer.identity)]
        return CategoricalDistribution(choices)
    raise ValueError(f"{key}: {type(value).__name__} is not a search space the Optuna sweeper knows")


def to_override(key: str, value: Any) -> str:
    """`key=value` in override syntax (strings quoted as needed, None as null)."""
    return f"{key}={Override._get_value_element_as_str(value)}"
