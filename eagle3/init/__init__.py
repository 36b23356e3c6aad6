"""Initializers: how the draft model starts. Each takes an InitContext and returns the model and a report.

New initializers register themselves with `@register("<name>")` (eagle3.init.registry) and get a config file
`conf/init/<name>.yaml` whose `name` key selects them.
"""

from __future__ import annotations

from eagle3.init import pretrained, scratch  # noqa: F401  (they register themselves)
from eagle3.init.registry import InitContext, build_draft, preflight_draft, register

__all__ = ["InitContext", "build_draft", "preflight_draft", "register"]
