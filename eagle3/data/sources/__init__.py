"""Data sources, one module each, registered by name (eagle3.data.sources.registry): `data=<name>` composes its
schema (conf/data/<name>.yaml holds only the deltas from it), and the run types `data` by its `name`.

A source is its schema: a DataConfig subclass with its own fields and `check`, and what the launcher (`materialize`,
`check_rows`), the ranks (`loaders`, `verifier_in_rank`) and the plan (`plan_stats`, `buffer_terms`) ask of it.
Adding one is a module with a `@register`ed schema, and an option file conf/data/<name>.yaml."""

from eagle3.data.sources import offline, online, regenerate, tiny  # noqa: F401  (each registers itself)
from eagle3.data.sources.registry import SOURCES, register, source_schema

__all__ = ["SOURCES", "register", "source_schema"]
